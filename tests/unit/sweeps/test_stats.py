"""Statistics of repeated runs on made-up numbers with known answers: intervals, Welch's verdicts,
ties within noise, single runs, and the comparison's verdict built on them."""

from __future__ import annotations

import math

import pytest

from seqlab.sweeps.compare import table, to_csv
from seqlab.sweeps.runs import RunRow
from seqlab.sweeps.stats import (
    GREATER,
    LESS,
    TIED,
    UNTESTED,
    compare_means,
    summarize,
    tied_with_best,
    welch_p,
)
from seqlab.sweeps.verdict import crossover_detail, fastest_to_target, group_runs, verdict


def test_mean_sd_and_the_student_t_interval():
    s = summarize([1.0, 2.0, 3.0, None, float("nan")])  # missing values are not measurements
    assert s.n == 3 and s.mean == 2.0 and s.sd == 1.0
    # t(0.975, 2) = 4.302653; half-width = t * sd / sqrt(n)
    assert s.half_width == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert s.lo == pytest.approx(2 - 2.484138, rel=1e-5) and s.hi == pytest.approx(
        2 + 2.484138, rel=1e-5
    )
    assert s.text(".3g", " s") == "2 ± 2.48 s"


def test_a_single_run_has_no_interval_and_no_test():
    one = summarize([5.0])
    assert one.n == 1 and one.mean == 5.0 and one.sd is None and one.lo is None and one.hi is None
    assert one.text(".3g") == "5"
    assert compare_means(one, summarize([1.0, 1.1, 0.9])) == UNTESTED
    assert summarize([]).text() == "-"


def test_welch_tells_a_clear_difference_from_noise():
    fast, slow = summarize([1.00, 1.02, 0.98]), summarize([2.00, 2.05, 1.95])
    assert compare_means(fast, slow) == LESS and compare_means(slow, fast) == GREATER
    # the same means, but a spread larger than the difference: a tie
    noisy_a, noisy_b = summarize([0.6, 1.4, 1.0]), summarize([0.8, 1.6, 1.2])
    assert compare_means(noisy_a, noisy_b) == TIED
    best, tied, untested = tied_with_best(
        {"a": noisy_a, "b": noisy_b, "c": slow, "d": summarize([0.1])}, True
    )
    assert best == "d" and tied == [] and set(untested) == {"a", "b", "c"}
    best, tied, untested = tied_with_best(
        {"a": noisy_a, "b": noisy_b, "c": slow}, lower_is_better=True
    )
    assert (best, tied, untested) == ("a", ["b"], [])


def _runs(device, batch, samples, ttt=None, perf="fast", status="FINISHED", reached=True, best=0.1):
    """One RunRow per repeat (seeds 0..n-1); ttt: one time to target per repeat (None: missed)."""
    rows = []
    for seed, s in enumerate(samples):
        t = ttt[seed] if ttt else None
        rows.append(
            RunRow(
                f"id-{device}-{batch}-{perf}-{seed}",
                f"{device}-bs{batch}-seed={seed}",
                status,
                device,
                batch,
                perf,
                s and s / batch,
                s,
                t,
                (t is not None) if ttt else None,
                0.1,
                best_val_rmse=best,
                seed=seed,
            )
        )
    return rows


def test_verdict_ranks_only_significant_differences_and_says_tied_otherwise():
    rows = (
        _runs("cpu", 32, [30000, 31000, 29000], ttt=[0.60, 0.62, 0.58], best=0.08)
        + _runs(
            "cpu", 128, [60000, 61000, 59000], ttt=[0.50, 0.80, 0.65], best=0.09
        )  # within noise of bs32
        + _runs("cpu", 1024, [90000, 92000, 91000], ttt=[3.0, 3.2, 3.1], best=0.2)  # clearly slower
        + _runs("cpu", 4096, [95000, 90000, 93000], ttt=[None, None, 5.0], best=0.5)
    )  # missed twice
    text = verdict(rows, 0.15)
    assert (
        "n = 3 repeats per configuration (seeds 0, 1, 2)" in text and "Welch's t-test at 5%" in text
    )
    fastest = text[text.index("Fastest to RMSE 0.15") : text.index("Lowest val RMSE")]
    assert fastest.startswith(
        "Fastest to RMSE 0.15: cpu, batch 32, perf=fast (0.6 ± 0.0497 s, n = 3)"
    )
    assert "tied within noise (n = 3) with: cpu, batch 128, perf=fast" in fastest
    assert "batch 1024" not in fastest  # significantly slower
    # one lucky repeat out of three does not rank a configuration by its time
    assert fastest.endswith(
        "; not ranked, having missed it in some repeats: cpu, batch 4096, perf=fast (reached in 1 of 3). "
    )
    assert (
        "Highest throughput: cpu, batch 4096, perf=fast (92,667 ± 6,252 samples/s, n = 3); "
        "tied within noise (n = 3) with: cpu, batch 1024, perf=fast (91,000 ± 2,484 samples/s, n = 3)."
    ) in text
    assert (
        "Repeats: 12 of 12 runs finished; 2 missed RMSE 0.15 (cpu, batch 4096, perf=fast: 2 of 3)."
        in text
    )
    assert fastest_to_target(rows).batch_size == 32
    out = table(rows)
    assert len(out.splitlines()) == 1 + 4 + 1 and "1/3" in out and "3/3" in out and "±" in out
    csv_rows = to_csv(rows).splitlines()
    assert len(csv_rows) == 5 and "samples_per_s_ci95_lo" in csv_rows[0]


def test_a_clear_winner_is_said_to_be_ahead():
    rows = _runs("cpu", 32, [30000, 30500, 29500], ttt=[0.5, 0.52, 0.48]) + _runs(
        "cpu", 256, [60000, 61000, 59000], ttt=[2.0, 2.1, 1.9]
    )
    text = verdict(rows, 0.15)
    assert (
        "Fastest to RMSE 0.15: cpu, batch 32, perf=fast (0.5 ± 0.0497 s, n = 3); significantly ahead"
        in text
    )
    assert "tied within noise" not in text.split("Fastest")[1].split("Lowest")[0]


def test_single_runs_still_give_a_verdict_and_say_they_are_single():
    rows = _runs("cpu", 32, [30000], ttt=[0.6]) + _runs("cpu", 128, [60000], ttt=[0.9])
    text = verdict(rows, 0.15)
    assert "One run per configuration (n = 1): no intervals and no tests" in text
    assert (
        "Fastest to RMSE 0.15: cpu, batch 32, perf=fast (0.6 s, n = 1); not tested against cpu, batch 128, perf=fast (n = 1)."
        in text
    )
    assert [g.n for g in group_runs(rows)] == [1, 1]


def test_failed_repeats_are_counted_and_left_out_of_the_statistics():
    rows = _runs("cpu", 32, [30000, 31000, 29000], ttt=[0.6, 0.6, 0.6]) + _runs(
        "cpu", 32, [None], status="FAILED"
    )
    rows[-1].run_id, rows[-1].seed, rows[-1].name = "failed", 3, "cpu-bs32-seed=3"
    (g,) = group_runs(rows)
    assert g.n == 3 and g.n_failed == 1 and g.stat("samples_per_s").n == 3
    assert "Repeats: 3 of 4 runs finished (cpu-bs32-seed=3: FAILED)" in verdict(rows, 0.15)


def test_the_crossover_is_stated_with_its_uncertainty():
    cpu = {
        64: [400, 410, 390],
        256: [900, 950, 850],
        1024: [1000, 1010, 990],
        4096: [1000, 1010, 990],
    }
    gpu = {
        64: [300, 310, 290],
        256: [880, 1100, 700],
        1024: [2000, 2100, 1900],
        4096: [8000, 8100, 7900],
    }
    rows = [r for b, v in cpu.items() for r in _runs("cpu", b, v)] + [
        r for b, v in gpu.items() for r in _runs("gpu", b, v)
    ]
    c = crossover_detail(group_runs(rows), "fast")
    assert (c.batch, c.after, c.tied, c.tested) == (1024, 64, [256], True)
    assert c.text() == (
        "GPU beats CPU from batch 1024 (perf=fast), significantly at every batch size from there; "
        "tied within noise at batch 256: the crossover lies between batch 64 and 1024."
    )
    assert c.text() in verdict(rows)


def test_runs_differing_only_in_seed_are_one_configuration():
    def row(seed, lr):
        r = _runs("cpu", 64, [1000])[0]
        r.run_id, r.seed = f"{seed}-{lr}", seed
        r.params = {
            "seed": str(seed),
            "data.seed": str(seed),
            "optimizer.lr": lr,
            "data.batch_size": "64",
            "paths.output_dir": f"/tmp/{seed}{lr}",
            "logger.run_name": "x",
        }
        return r

    groups = group_runs(
        [row(0, "0.01"), row(1, "0.01"), row(2, "0.01"), row(0, "0.1"), row(1, "0.1")]
    )
    assert [(g.extra, g.n) for g in groups] == [("optimizer.lr=0.01", 3), ("optimizer.lr=0.1", 2)]


def test_a_packs_members_count_once_for_speed_and_each_for_accuracy():
    """The members of a pack share one speed measurement (their pack's steps/s): n and the interval
    of it/s, samples/s and model-steps/s count packs; best_val_rmse counts every member."""
    rows = []
    for pack, rate in (("p0", 200.0), ("p1", 220.0)):
        for k in range(4):
            rows.append(
                RunRow(
                    f"{pack}-{k}",
                    f"m{k}",
                    "FINISHED",
                    "cpu",
                    64,
                    "fast, packed",
                    rate,
                    rate * 64,
                    None,
                    None,
                    0.1,
                    best_val_rmse=0.1 + 0.01 * k,
                    seed=k,
                    model_steps_per_s=4 * rate,
                    pack_id=pack,
                )
            )
    (group,) = group_runs(rows)
    assert group.stat("it_per_s").n == 2 and group.stat("it_per_s").mean == 210.0
    assert group.stat("model_steps_per_s").n == 2 and group.stat("model_steps_per_s").mean == 840.0
    assert group.stat("best_val_rmse").n == 8
    text = verdict(rows)
    assert (
        "Most networks trained per second (a pack counts all its members; the machine used fully): "
        "cpu, batch 64, perf=fast, packed (840 ± 508 model-steps/s, n = 2)" in text
    )  # t(0.975, 1) x sd 56.6 / sqrt 2
    assert text.startswith(
        "n = 8 repeats per configuration (seeds 0-3);"
    )  # a run of seeds said short (packs of 32: 0-95)
    # Beside runs alone, "where is one run fastest" is theirs: a member's samples/s is its pack's
    # steps x its own batch, shared by K networks, and never ranked against a run alone.
    alone = [
        RunRow(
            f"a{k}",
            f"a{k}",
            "FINISHED",
            "cpu",
            64,
            "fast",
            100.0 + k,
            (100.0 + k) * 64,
            None,
            None,
            0.1,
            best_val_rmse=0.1,
            seed=k,
            model_steps_per_s=100.0 + k,
        )
        for k in range(3)
    ]
    text = verdict(rows + alone)
    assert "Highest throughput of one run: cpu, batch 64, perf=fast (6,464" in text
    assert (
        "Most networks trained per second (a pack counts all its members; the machine used fully): "
        "cpu, batch 64, perf=fast, packed (840" in text
    )


def test_unequal_variances_are_tested_by_welch_not_by_student():
    # Issue 24, point 7: three tight repeats against ten noisy ones. Student's test (pooled
    # variance) calls them tied (p = 0.058); Welch's, which the README promises, finds the
    # difference (p = 0.0031). The expected p-value is Welch's formula written out here.
    from scipy.stats import t as student_t

    a, b = [10.0, 10.2, 9.8], [11.0, 14.0, 8.0, 16.0, 12.0, 15.0, 13.0, 17.0, 12.5, 14.5]
    sa, sb = summarize(a), summarize(b)
    va, vb = sa.sd**2 / sa.n, sb.sd**2 / sb.n
    t_value = (sa.mean - sb.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    expected = 2 * student_t.sf(abs(t_value), df)
    assert welch_p(sa, sb) == pytest.approx(expected, rel=1e-9)
    assert welch_p(sa, sb) == pytest.approx(0.0031178, rel=1e-4)
    assert compare_means(sa, sb) == LESS
