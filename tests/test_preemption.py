"""A job that submitit's executor stops with its preemption signal (SIGUSR2: a time limit near, or
a preemption) stops at a step boundary, is requeued and continues its own MLflow run: the same
path as under SLURM (tests/test_cluster.py), through hydra/launcher=submitit_local."""

from __future__ import annotations

import signal

import psutil
import pytest

from conftest import start_cli
from test_cluster import LONG, LONG_STEPS, _each_step_once, _job_logs, _runs, _wait_until_training


@pytest.mark.slow
def test_submitits_preemption_signal_requeues_a_local_job(tmp_path, store):
    """The same preemption without SLURM: submitit's local executor, its signal (SIGUSR2), its requeue."""
    proc = start_cli(tmp_path, "-m", "hydra/launcher=submitit_local", "trainer.accelerator=cpu", "logger.system_metrics=false", *LONG)
    try:
        _wait_until_training(tmp_path, proc)
        (job,) = [p for p in psutil.Process(proc.pid).children(recursive=True)
                  if "submitit.core._submit" in " ".join(p.cmdline())]
        job.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    _, (run,) = _runs(store, "seqlab")
    assert run.info.status == "FINISHED" and "interrupted_at_step" not in run.data.tags
    logs = _job_logs(tmp_path)
    assert "SIGUSR2: the job is preempted or near its time limit" in logs
    assert "preempted: MLflow run" in logs and "Requeued job" in logs  # submitit's own line
    assert f"requeue   this job started again: it continues its run {run.info.run_id}" in logs
    assert _each_step_once(store, run.info.run_id) == list(range(1, LONG_STEPS + 1))
