"""The device x batch-size study: time to target, system metrics, the comparison (table,
crossover, plots, verdict, artifacts on the parent run) and the sweep preset through the CLI."""

from __future__ import annotations

import pytest

from seqlab.sweeps.compare import table
from seqlab.sweeps.runs import RunRow
from seqlab.sweeps.verdict import crossover, fastest_to_target, verdict


def _row(device, batch, samples, perf="fast", ttt=None, status="FINISHED", reached=None):
    return RunRow(
        f"id-{device}-{batch}-{perf}",
        f"{device}-bs{batch}",
        status,
        device,
        batch,
        perf,
        samples / batch if samples else None,
        samples,
        ttt,
        reached,
        0.1,
    )


@pytest.mark.parametrize(
    "cpu, gpu, expected",
    [
        ({16: 100, 64: 400, 256: 900, 1024: 1000}, {16: 50, 64: 300, 256: 1200, 1024: 5000}, 256),
        ({16: 100, 64: 400}, {16: 50, 64: 300}, None),  # the GPU never overtakes
        (
            {16: 100, 64: 400, 256: 900},
            {16: 150, 64: 300, 256: 1200},
            256,
        ),  # an early win that does not last
        ({16: 100}, {}, None),  # no GPU runs
    ],
)
def test_crossover_is_where_the_gpu_stays_ahead(cpu, gpu, expected):
    rows = [_row("cpu", b, s) for b, s in cpu.items()] + [_row("gpu", b, s) for b, s in gpu.items()]
    assert crossover(rows) == expected


def test_verdict_table_and_failed_runs_shown():
    rows = [
        _row("cpu", 64, 30000, ttt=4.0),
        _row("cpu", 256, 60000, ttt=2.5),
        _row("gpu", 64, 20000, ttt=9.0),
        _row("gpu", 256, 90000, ttt=3.0),
        _row("gpu", 1024, None, status="FAILED", reached=None),
        _row("cpu", 1024, 70000, reached=False),
    ]
    text = verdict(rows, 0.15)
    assert text.startswith("One run per configuration (n = 1): no intervals and no tests")
    assert "GPU beats CPU from batch 256 (perf=fast; single runs: no test)." in text
    assert (
        "Fastest to RMSE 0.15: cpu, batch 256, perf=fast (2.5 s, n = 1); not tested against the other 3 (n = 1)."
        in text
    )
    assert "Highest throughput: gpu, batch 256" in text
    assert (
        "Repeats: 5 of 6 runs finished (gpu-bs1024: FAILED); 1 missed RMSE 0.15 (cpu, batch 1024, perf=fast: 1 of 1)."
        in text
    )
    assert fastest_to_target(rows).batch_size == 256
    out = table(rows)
    assert "0/1" in out and "FAILED" in out and len(out.splitlines()) == 1 + 6 + 1
