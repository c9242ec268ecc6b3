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

from seqlab.sweeps.job import cpu_count


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
    # Issue 32, point 5: a pack across ranks. One sweep of two DDP jobs of two CPU processes each:
    # seed 0 alone, and (replicas=2) seeds 0 and 1 packed into one job: each member its own run
    # (from rank 0 only), each process a half of every member's samples, and the packed seed 0
    # trains as its job alone (a DDP job too) does.
    # Issue 24, point 6: a password typed on the command line stays where it was typed; the
    # processes the job starts show no overrides (ps shows command lines to every user).
    n_train, bs = 512, 32  # 640 samples, 20% for validation
    secret = f"paths.optuna_storage=postgresql://bob:{SECRET}@dbhost/optuna"
    out, line = _sweep_of_ranks(tmp_path, "seed=0", "replicas=1,2", secret)
    assert SECRET not in line and "trainer.devices=2" not in line, line
    assert "2 members in one step on cpu" in out
    client = _store(tmp_path)
    runs = runs_of(client, "seqlab")
    (parent,) = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    members = sorted(
        (r for r in runs if "pack_id" in r.data.tags), key=lambda r: r.data.tags["pack_member"]
    )  # one run a member, from rank 0 only
    (alone,) = [r for r in runs if r not in members and r is not parent]
    assert len(members) == 2 and parent.info.status == "FINISHED"
    assert [r.data.params["seed"] for r in members] == ["0", "1"]
    assert alone.data.params["seed"] == "0"
    # rank 1 trained with the job's config: each process on half the samples, 512 / (32 x 2) = 8 steps an epoch
    for run in [*members, alone]:
        assert run.info.status == "FINISHED" and run.data.params["trainer.devices"] == "2"
        # Each of the two processes on its half of the cores (Lightning's share, given first).
        assert run.data.tags["torch_threads"] == str(max(1, cpu_count() // 2))
        losses = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in losses] == list(range(1, 2 * n_train // (bs * 2) + 1))
        assert all(math.isfinite(m.value) for m in losses)
        assert len(client.get_metric_history(run.info.run_id, "val_rmse")) == 2
    sweep_dir = next((tmp_path / "logs" / "multiruns").iterdir())
    assert len(list(sweep_dir.glob("*/train_ddp_process_1.log"))) == 2  # rank 1 ran as each job
    for key in ("train_loss", "val_rmse"):
        packed = [m.value for m in client.get_metric_history(members[0].info.run_id, key)]
        expected = [m.value for m in client.get_metric_history(alone.info.run_id, key)]
        assert packed == pytest.approx(expected, rel=1e-4), key
