"""seqlab.benchmark.overhead's arithmetic: what a command spent, from its runs' costs.json."""

from __future__ import annotations

import pytest

from seqlab.benchmark.overhead import (
    COMMAND_ROWS,
    PROCESS_PHASES,
    RUN_PHASES,
    Command,
    Measure,
    summary,
    table,
    verdicts,
)


def _run(job, pack_id, training_s, store, imports, written_at=100.0):
    return {
        "job": job,
        "pack_id": pack_id,
        "training_s": training_s,
        "run": {"store": store, "models": 1.0},
        "process": {"imports": imports},
        "first_job_at": 82.0 if imports else None,  # a process's later jobs: no start of their own
        "written_at": written_at,
    }


def test_a_packs_process_and_training_count_once_and_jobs_one_by_one_add_up():
    members = [_run(0, "s-p0", 5.0, 0.1, 6.0, 100.0), _run(0, "s-p0", 4.0, 0.1, 6.0, 101.0)]
    pack = Command("pack", 20.0, members, launched_at=80.0, ended_at=102.5)
    totals = pack.totals()
    assert totals["start"] == 2.0 and totals["imports"] == 6.0  # the members' process, once
    assert totals["training"] == 5.0  # the pack trains once, as long as its longest member
    assert totals["store"] == pytest.approx(0.2) and totals["models"] == 2.0  # each member's own
    assert totals["after the last run"] == 1.5  # from the last member's end to the exit
    assert totals["other"] == pytest.approx(20.0 - 2.0 - 6.0 - 5.0 - 0.2 - 2.0 - 1.5)
    jobs = [_run(0, None, 5.0, 0.1, 6.0), _run(1, None, 4.0, 0.1, 0.0)]
    totals = Command("one-by-one", 30.0, jobs, launched_at=80.0, ended_at=110.0).totals()
    assert totals["start"] == 2.0 and totals["imports"] == 6.0  # once: its first job paid them
    assert totals["training"] == 9.0


def test_the_summary_takes_medians_over_repeats_and_runs_and_the_table_has_every_phase():
    measured = [
        Command("single", wall, [_run(None, None, 3.0, store, 6.0)], 80.0, 80.0 + wall)
        for wall, store in ((10.0, 1.0), (12.0, 0.2), (30.0, 0.3))
    ]
    summ = summary(measured)
    assert summ["single"]["command"]["wall"] == 12.0
    assert summ["single"]["run"]["store"] == 0.3
    assert summ["single"]["run"]["training"] == 3.0
    text = table(summ, 3)
    for phase in (*PROCESS_PHASES, *RUN_PHASES, *COMMAND_ROWS):
        assert any(line.startswith(phase) for line in text.splitlines()), phase
    assert "medians over 3 repeat(s)" in text


def test_the_verdicts_hold_each_repeat_to_its_own_yardstick_and_give_the_range():
    single = [
        Command("single", wall, [_run(None, None, 4.0, 0.1, 6.0)], 80.0, 80.0 + wall)
        for wall in (13.0, 14.0, 20.0)
    ]
    pack = [Command("pack", wall, [_run(0, "p", 5.0, 0.1, 6.0)]) for wall in (20.0, 30.0, 24.0)]
    alone = [Command("one-by-one", wall, [_run(0, None, 5.0, 0.1, 6.0)]) for wall in (80.0, 90, 60)]
    # single repeat by repeat: 13 - (4 + 8) = 1.0, 14 - (4 + 9) = 1.0, 20 - (4 + 8) = 8.0
    lines = verdicts(Measure([*single, *pack, *alone], [8.0, 9.0, 8.0]))
    assert lines[0] == (
        "single: wall - (training + imports alone) (s): 1.00 (1.00-8.00); target <= 1.5: met"
    )
    # 20/80, 30/90, 24/60: median 0.33
    assert lines[1] == "pack of 8 / one by one (wall): 0.33 (0.25-0.40); target <= 0.3: not met"
    # The pack's start 0 (no launch time), imports 6, training 5: 11/80, 11/90, 11/60; median 0.14;
    # 0.3 x 80 - 11 = 13, 16, 7: median 13 s left
    assert lines[2] == (
        "pack of 8's floor, (its start, imports and training) / one by one (wall): 0.14"
        " (0.12-0.18): the target leaves 13.0 s for its data, runs and records"
    )
    # The pack's training alone over the target: no record left out would reach it.
    slow = [Command("pack", 30.0, [_run(0, "p", 30.0, 0.1, 6.0)]) for _ in range(3)]
    assert verdicts(Measure([*slow, *alone], [8.0, 9.0, 8.0]))[1].endswith(
        "above the target: no cut outside training reaches it"
    )
    assert lines[3].startswith(
        "imports alone (import torch, pytorch_lightning, mlflow, hydra): 8.00"
    )


def test_each_repeat_times_the_yardstick_beside_its_commands_and_a_smoke_run_does_not(
    monkeypatch, tmp_path
):
    from seqlab.benchmark import overhead

    ran = []
    monkeypatch.setattr(overhead, "time_imports", lambda: ran.append("imports") or 7.0)
    monkeypatch.setattr(
        overhead,
        "run_command",
        lambda case, args, root: (
            ran.append(case) or Command(case, 1.0, [_run(None, None, 1, 0, 1)])
        ),
    )
    measured = overhead.measure(["single", "pack"], 2, False, tmp_path)
    assert ran == ["imports", "single", "pack", "imports", "single", "pack"]
    assert measured.imports_s == [7.0, 7.0] and len(measured.commands) == 4
    ran.clear()
    assert overhead.measure(["single"], 1, True, tmp_path).imports_s == [] and ran == ["single"]
