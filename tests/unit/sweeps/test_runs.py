"""Repeated trials and sweeps that resume, through the real CLI: a sweep with 3 seeds per
configuration ends with a parent whose comparison has n = 3 and intervals; a sweep stopped by
SIGTERM in its third job continues with resume=latest into the same runs; every run records its
best val_rmse and when it was reached."""

from __future__ import annotations

import os


def test_a_job_run_again_counts_once_by_its_newest_run(store):
    from seqlab.sweeps.runs import find_runs

    exp = store.create_experiment("rerun")
    store.create_run(
        exp, tags={"sweep_id": "s1", "sweep_role": "parent"}, run_name="sweep-s1", start_time=1
    )
    for name, status, start, overrides in [
        ("failed", "FAILED", 2, "seed=0 data.batch_size=32"),
        ("rerun", "FINISHED", 5, "seed=0 data.batch_size=32 resume=latest"),
        ("other", "FINISHED", 3, "seed=1 data.batch_size=32"),
    ]:
        run = store.create_run(
            exp,
            tags={"sweep_id": "s1", "hydra_overrides": overrides},
            run_name=name,
            start_time=start,
        )
        store.set_terminated(run.info.run_id, status)
    runs, parent = find_runs(store, "rerun", "latest")
    assert parent.info.run_name == "sweep-s1"
    assert sorted(r.info.run_name for r in runs) == ["other", "rerun"]


def test_a_sweep_still_running_is_told_from_one_that_died():
    import socket

    from seqlab.sweeps.callback import _alive

    here = socket.gethostname()
    assert _alive({"sweep_host": here, "sweep_pid": str(os.getppid())})  # a live process
    assert not _alive(
        {"sweep_host": here, "sweep_pid": "4194304"}
    )  # above Linux's highest pid: gone
    assert not _alive({"sweep_host": "elsewhere", "sweep_pid": str(os.getppid())})
    assert not _alive({})  # a sweep from before these tags
