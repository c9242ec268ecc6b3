"""seqlab.tracking.costs: a run's bookkeeping, phase by phase (issue 35, point 1)."""

from __future__ import annotations

import json
import time

from seqlab.tracking import costs
from seqlab.tracking.costs import Costs


def _clock(monkeypatch, *readings: float) -> None:
    times = iter(readings)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: next(times))


def test_a_phase_inside_another_counts_once_in_the_inner_one(monkeypatch):
    spent = Costs()
    _clock(monkeypatch, 0.0, 1.0, 3.0, 10.0, 20.0, 20.5)
    with spent.phase("end"):  # 0 .. 10: 2 s of it in "models"
        with spent.phase("models"):  # 1 .. 3
            pass
    with spent.phase("end"):  # again: 0.5 s more
        pass
    assert spent.phases == {"models": 2.0, "end": 8.5}
    assert sum(spent.phases.values()) == 10.5  # the wall time of both, nothing counted twice


def test_a_failing_phase_is_still_counted(monkeypatch):
    spent = Costs()
    _clock(monkeypatch, 0.0, 4.0)
    try:
        with spent.phase("store"):
            raise ValueError("no store")
    except ValueError:
        pass
    assert spent.phases == {"store": 4.0}


def test_the_first_job_of_a_process_is_noted_once_and_each_job_starts_its_costs_anew(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(costs, "first_job_at", None)
    before = time.time()
    costs.job_starts()
    first = costs.first_job_at
    assert before <= first <= time.time()
    costs.PROCESS.phases["imports"] = 2.0
    run = Costs({"store": 0.5}, training_s=3.0)
    costs.write(tmp_path, run, 4, "s-p0")
    written = json.loads((tmp_path / costs.FILE).read_text())
    assert first <= written.pop("written_at") <= time.time()
    assert written == {
        "job": 4,
        "pack_id": "s-p0",
        "training_s": 3.0,
        "run": {"store": 0.5},
        "process": {"imports": 2.0},
        "first_job_at": first,
    }
    costs.job_starts()  # the next job of this process: its imports are paid, its start is the first's
    assert costs.PROCESS.phases == {} and costs.first_job_at == first


def test_a_costs_file_that_cannot_be_written_does_not_fail_the_run(tmp_path):
    costs.write(tmp_path / "missing", Costs(), None)  # no folder: nothing written, nothing raised
    assert not (tmp_path / "missing").exists()
