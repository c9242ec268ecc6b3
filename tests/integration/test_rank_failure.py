"""DDP: a rank that dies ends the job's run FAILED with one line naming the rank, instead of a
traceback, or rank 0 killed with it and its run left RUNNING."""

from __future__ import annotations

import math
import signal
import subprocess
import time

import mlflow
import psutil
import pytest
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


def _store(root):
    return mlflow.MlflowClient(f"sqlite:///{root}/mlruns/mlflow.db")


def _sweep_of_ranks(tmp_path, *args: str) -> tuple[str, str]:
    """A multirun of DDP jobs of two CPU processes: its output, and rank 1's command line."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = start_cli(
        tmp_path,
        "-m",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "data.n_samples=640",
        "data.batch_size=32",
        "trainer.max_epochs=2",
        "logger.system_metrics=false",
        *args,
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
    return out, line


def test_a_ddp_pack_trains_each_member_as_its_ddp_job_alone_with_overrides_kept_off_command_lines(
    tmp_path,
):
    # Issue 32, point 5: a pack across ranks. Two seeds packed into one DDP job of two CPU
    # processes: each member its own run (from rank 0 only), each process a half of every member's
    # samples, and member 1 trains as the job of its seed alone (a DDP job too) does.
    # Issue 24, point 6: a password typed on the command line stays where it was typed; the
    # processes the job starts show no overrides (ps shows command lines to every user).
    n_train, bs = 512, 32  # 640 samples, 20% for validation
    secret = f"paths.optuna_storage=postgresql://bob:{SECRET}@dbhost/optuna"
    out, line = _sweep_of_ranks(tmp_path / "pack", "seed=0,1", "pack=2", secret)
    assert SECRET not in line and "trainer.devices=2" not in line, line
    assert "2 members in one step on cpu" in out
    runs = runs_of(_store(tmp_path / "pack"), "seqlab")
    (parent,) = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    members = sorted(
        (r for r in runs if r.data.tags.get("sweep_role") != "parent"),
        key=lambda r: r.data.tags["pack_member"],
    )  # one run a member, from rank 0 only
    assert len(members) == 2 and parent.info.status == "FINISHED"
    # rank 1 trained with the job's config: each process on half the samples, 512 / (32 x 2) = 8 steps an epoch
    client = _store(tmp_path / "pack")
    for run in members:
        assert run.info.status == "FINISHED" and run.data.params["trainer.devices"] == "2"
        losses = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in losses] == list(range(1, 2 * n_train // (bs * 2) + 1))
        assert all(math.isfinite(m.value) for m in losses)
        assert len(client.get_metric_history(run.info.run_id, "val_rmse")) == 2
    job_dir = next((tmp_path / "pack" / "logs" / "multiruns").iterdir()) / "0"
    assert (job_dir / "train_ddp_process_1.log").is_file()  # rank 1 ran as this job

    _sweep_of_ranks(tmp_path / "alone", "seed=1")
    alone = _store(tmp_path / "alone")
    (run,) = [r for r in runs_of(alone, "seqlab") if r.data.tags.get("sweep_role") != "parent"]
    for key in ("train_loss", "val_rmse"):
        packed = [m.value for m in client.get_metric_history(members[1].info.run_id, key)]
        expected = [m.value for m in alone.get_metric_history(run.info.run_id, key)]
        assert packed == pytest.approx(expected, rel=1e-4), key
