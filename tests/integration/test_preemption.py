"""A job that submitit's executor stops with its preemption signal (SIGUSR2: a time limit near, or
a preemption) stops at a step boundary, is requeued and continues its own MLflow run: the same
path as under SLURM (tests/integration/test_cluster.py), through hydra/launcher=submitit_local."""

from __future__ import annotations

import signal

import psutil
from conftest import start_cli
from harness.cluster import (
    BOTH,
    BOTH_STEPS,
    _each_step_once,
    _job_logs,
    _runs,
    _stop_each_once_training,
)


def _task_of(proc, job: str) -> psutil.Process:
    """The training process of submitit's local job `job` (its controller's pid): the task started
    with SUBMITIT_LOCAL_JOB_ID=job, where submitit's executor sends its signal."""
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if (
                "submitit.core._submit" in " ".join(p.cmdline())
                and p.environ().get("SUBMITIT_LOCAL_JOB_ID") == job
            ):
                return p
        except psutil.Error:  # a child that ended (a zombie, gone) since the list was taken
            continue
    raise AssertionError(f"no training process of local job {job}")


def test_submitits_preemption_signal_requeues_a_local_job_and_pack(tmp_path, store):
    """The same preemption without SLURM: submitit's local executor, its signal (SIGUSR2), its requeue,
    for a job alone and a pack (issue 32) in one sweep."""
    proc = start_cli(
        tmp_path,
        "-m",
        "hydra/launcher=submitit_local",
        "trainer.accelerator=cpu",
        "logger.system_metrics=false",
        *BOTH,
    )
    try:
        _stop_each_once_training(
            tmp_path, proc, 2, lambda job: _task_of(proc, job).send_signal(signal.SIGUSR2)
        )
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    _, runs = _runs(store, "seqlab")
    assert (
        len(runs) == 3 and sum("pack_id" in r.data.tags for r in runs) == 2
    )  # the same runs, continued
    logs = _job_logs(tmp_path)
    # The job alone and the pack, each stopped by the same graceful stop (resume.interrupt.GracefulStop).
    assert (
        logs.count("SIGUSR2: the job is preempted or near its time limit; stopping after this step")
        == 2
    )
    assert "preempted: MLflow run" in logs and "preempted: the pack's runs ended KILLED" in logs
    assert logs.count("Requeued job") >= 2  # submitit's own line, for each
    for run in runs:
        assert run.info.status == "FINISHED" and "interrupted_at_step" not in run.data.tags
        assert f"requeue   this job started again: it continues its run {run.info.run_id}" in logs
        assert _each_step_once(store, run.info.run_id) == list(range(1, BOTH_STEPS + 1))
