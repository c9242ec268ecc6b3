"""The throughput table's ratio to bare knows its noise: each repeat against the bare run beside it."""

from __future__ import annotations

import pytest

from seqlab.benchmark.throughput import Row, one_order_lines, paired_ratios, table


def test_each_repeat_is_held_to_the_bare_run_beside_it_with_the_interval_of_their_mean():
    # The machine slowed in repeat 2 for both loops alike: the pairs keep the ratio near 0.9.
    noise = paired_ratios([900.0, 450.0, 910.0], [1000.0, 500.0, 1000.0], members=1)
    assert noise.values == pytest.approx((0.9, 0.9, 0.91))
    assert noise.lo < 0.9 < 0.91 < noise.hi and noise.hi - noise.lo < 0.05
    # A pack's model-steps/s are K x its steps/s, held to one bare network's rate.
    assert paired_ratios([500.0, 520.0], [1000.0, 1000.0], members=8).values == (4.0, 4.16)
    # One repeat says nothing about the noise; no bare run, nothing to pair.
    assert paired_ratios([900.0], [1000.0], 1).lo is None
    assert paired_ratios([900.0, 910.0], [], 1).values == ()


def test_the_table_prints_the_interval_or_a_dash():
    def row(loop: str, noise) -> Row:
        return Row(
            "cpu",
            "seed",
            loop,
            64,
            100,
            1000.0,
            64000.0,
            ratio_to_bare=noise.mean or 1.0,
            paired_ratios=list(noise.values),
            ratio_lo=noise.lo,
            ratio_hi=noise.hi,
        )

    text = table(
        [
            row("bare", paired_ratios([1.0, 1.0], [1.0, 1.0], 1)),
            row("default", paired_ratios([0.92, 0.94, 0.93], [1.0, 1.0, 1.0], 1)),
            row("naive", paired_ratios([0.5], [1.0], 1)),
        ]
    )
    lines = text.splitlines()
    assert "95% (paired)" in lines[0]
    assert " 0.91-0.95x " in lines[2]  # the default: 0.93 +- 4.303 x 0.01 / sqrt(3)
    assert lines[1].split()[-3] == "-" and lines[3].split()[-3] == "-"  # bare; one repeat


def test_a_pack_of_one_order_is_held_to_the_pack_of_many_beside_it_repeat_by_repeat():
    def row(loop: str, runs: list[float]) -> Row:
        return Row("cpu", "seed", loop, 64, 100, sorted(runs)[1], 0.0, runs=runs, members=32)

    lines = one_order_lines(
        [row("packed", [100.0, 200.0, 150.0]), row("packed-lr", [210.0, 380.0, 300.0])]
    )
    # Paired: 2.1, 1.9, 2.0 (mean 2.0, sd 0.1, t 4.303: +-0.248); the medians' ratio 300 / 150.
    assert lines == [
        "packed32-lr over packed32 (cpu, seed, batch 64): 2.00x, 95% (paired) 1.75-2.25x "
        "(3 repeats; one data order shared by the members against one order each)"
    ]
    assert one_order_lines([row("packed-lr", [1.0, 2.0, 3.0])]) == []  # nothing beside it
