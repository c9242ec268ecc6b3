"""DDP: a rank that dies ends the job's run FAILED with one line naming the rank, instead of a
traceback, or rank 0 killed with it and its run left RUNNING."""

from __future__ import annotations

import math
import signal
import subprocess
import time

import psutil
from conftest import runs_of, start_cli


def _rank_process(parent: psutil.Process, rank: int, timeout_s: float = 120) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                if f"hydra.job.name=train_ddp_process_{rank}" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never started")


SECRET = "pg-pass-9911"


def test_a_ddp_rank_killed_mid_run_fails_the_run_with_one_line_naming_it(tmp_path, store):
    # A single run's overrides, a password among them, reach its ranks as a sweep's job's do (below):
    # through the environment, not their command lines.
    proc = start_cli(
        tmp_path,
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "data.n_samples=640",
        "data.batch_size=32",
        "trainer.max_epochs=1000",
        f"paths.optuna_storage=postgresql://bob:{SECRET}@dbhost/optuna",
        stderr=subprocess.STDOUT,
    )
    try:
        rank1 = _rank_process(psutil.Process(proc.pid), 1)
        line = " ".join(rank1.cmdline())
        assert SECRET not in line and "trainer.devices=2" not in line, line
        deadline = time.monotonic() + 180  # until rank 0 has a run that is training
        while time.monotonic() < deadline:
            experiment = store.get_experiment_by_name("seqlab")
            runs = runs_of(store, "seqlab") if experiment else []
            if runs and store.get_metric_history(runs[0].info.run_id, "train_loss"):
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        rank1.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out[-3000:]
    assert errors[0].startswith(
        f"error: DDP process rank 1 (pid {rank1.pid}) was killed by SIGKILL, so the job stopped; "
        "its output: "
    ), errors[0]
    assert errors[0].endswith("train_ddp_process_1.log")
    assert "Traceback" not in out
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FAILED"
    assert run.data.tags["failure_reason"] == errors[0].removeprefix("error: ")


def test_a_ddp_jobs_overrides_reach_its_ranks_through_the_environment_not_their_command_lines(
    tmp_path, store
):
    # Issue 24, point 6: a password typed on the command line stays where it was typed; the
    # processes the job starts show no overrides (ps shows command lines to every user).
    # The same sweep of one DDP job of two CPU processes (it was tests/integration/test_scale.py's own): one run
    # for the job, from rank 0 only, each process a half of the samples.
    n_train, bs = 512, 32  # 640 samples, 20% for validation
    proc = start_cli(
        tmp_path,
        "-m",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "data.n_samples=640",
        f"data.batch_size={bs}",
        "trainer.max_epochs=2",
        "logger.system_metrics=false",
        f"paths.optuna_storage=postgresql://bob:{SECRET}@dbhost/optuna",
        stderr=subprocess.STDOUT,
    )
    try:
        rank1 = _rank_process(psutil.Process(proc.pid), 1)
        line = " ".join(rank1.cmdline())
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert SECRET not in line and "trainer.devices=2" not in line, line
    runs = runs_of(store, "seqlab")
    (parent,) = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    (run,) = [
        r for r in runs if r.data.tags.get("sweep_role") != "parent"
    ]  # one run for the job, from rank 0 only
    assert parent.info.status == "FINISHED" and run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    # rank 1 trained with the job's config: each process on half the samples, 512 / (32 x 2) = 8 steps an epoch
    assert run.data.params["trainer.devices"] == "2"
    losses = store.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in losses] == list(range(1, 2 * n_train // (bs * 2) + 1))
    assert all(math.isfinite(m.value) for m in losses)
    assert len(store.get_metric_history(run.info.run_id, "val_rmse")) == 2
    job_dir = next((tmp_path / "logs" / "multiruns").iterdir()) / "0"
    assert (job_dir / "train_ddp_process_1.log").is_file()  # rank 1 ran as this job
