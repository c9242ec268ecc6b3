"""Past one machine, for real: sweeps as SLURM jobs on a one-node cluster (the `slurm` fixture,
tests/slurm_cluster.py), a DDP job of two SLURM tasks, and a job stopped mid-run by the cluster
(scontrol requeue) that continues its own MLflow run. Without SLURM: tests/test_preemption.py."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import mlflow
import pytest

from conftest import start_cli, runs_of

# Jobs of one CPU each, so the two-core node runs two at once; small enough for any node.
ON_THE_NODE = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
               "trainer.accelerator=cpu", "logger.system_metrics=false"]
# A job long enough to be stopped mid-run: 7 steps an epoch (410 training samples, batch 64). The
# stop lands near epoch 10 (the test waits for epoch 2, then signals).
LONG = ["data.n_samples=512", "trainer.max_epochs=60"]
LONG_STEPS = 7 * 60


def _server(mlflow_server, experiment: str) -> list[str]:
    return ["logger=mlflow_server", f"logger.tracking_uri={mlflow_server.uri}", f"logger.experiment_name={experiment}"]


def _runs(client, experiment: str):
    runs = runs_of(client, experiment)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    return parents, [r for r in runs if r.data.tags.get("sweep_role") != "parent"]


def _job_logs(tmp_path: Path) -> str:
    """What the sweep's jobs printed (submitit keeps each task's stdout and stderr)."""
    return "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("logs/multiruns/*/.submitit/*/*_log.*")))


def _wait_until_training(tmp_path: Path, proc, timeout: float = 120) -> None:
    """Until a job has finished an epoch (a stop before fit starts would save no checkpoint)."""
    deadline = time.monotonic() + timeout
    while "epoch 2/" not in _job_logs(tmp_path):
        assert proc.poll() is None, "the sweep ended before its job trained"
        assert time.monotonic() < deadline, f"no job trained within {timeout:.0f} s:\n{_job_logs(tmp_path)[-3000:]}"
        time.sleep(0.2)


def _each_step_once(client, run_id: str, key: str = "train_loss") -> list[int]:
    steps = [m.step for m in client.get_metric_history(run_id, key)]
    twice = [s for s, n in collections.Counter(steps).items() if n > 1]
    assert not twice, f"{key} stored twice at steps {twice[:10]}"
    return sorted(steps)


@pytest.mark.slow
def test_a_sweep_runs_as_slurm_jobs(slurm, mlflow_server, run_process, tmp_path):
    proc = run_process("-m", *ON_THE_NODE, *_server(mlflow_server, "slurm-sweep"), "data.n_samples=256",
                       "trainer.max_epochs=2", "seed=0,1", env=slurm.env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    (parent,), children = _runs(client, "slurm-sweep")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert {r.info.status for r in children} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    # Each an array task of one SLURM job, the jobs' own processes on the node.
    jobs = sorted(r.data.tags["slurm_job_id"] for r in children)
    assert len(set(jobs)) == 2 and len({j.split("_")[0] for j in jobs}) == 1, jobs
    assert {r.data.params["seed"] for r in children} == {"0", "1"}
    # The summary and the comparison, as a local sweep prints them.
    assert "2 jobs, 0 failed" in proc.stdout and "verdict: n = 2 repeats per configuration" in proc.stdout
    sweep_dir = next(tmp_path.glob("logs/multiruns/*"))
    assert (sweep_dir / "sweep_summary.csv").read_text().count("FINISHED") == 2
    assert len(list(sweep_dir.glob(".submitit/*/*_submission.sh"))) == 1  # one sbatch, an array of 2


@pytest.mark.slow
def test_a_ddp_job_of_two_slurm_tasks(slurm, mlflow_server, run_process, tmp_path):
    proc = run_process("-m", *ON_THE_NODE, *_server(mlflow_server, "slurm-ddp"), "trainer.devices=2",
                       "trainer.strategy=ddp", "data.n_samples=256", "trainer.max_epochs=2", env=slurm.env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    (parent,), (run,) = _runs(client, "slurm-ddp")  # one run: rank 0 tracks, rank 1 only trains
    assert run.info.status == parent.info.status == "FINISHED"
    # Two processes, each a half of the 205 training samples: 2 steps of 64 an epoch, not 4.
    assert _each_step_once(client, run.info.run_id) == [1, 2, 3, 4]
    logs = _job_logs(tmp_path)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in logs and "GLOBAL_RANK: 1, MEMBER: 2/2" in logs
    assert len(list(tmp_path.glob("logs/multiruns/*/.submitit/*/*_1_log.out"))) == 1  # task 1 of the job


@pytest.mark.slow
def test_a_requeued_slurm_job_continues_its_run(slurm, mlflow_server, tmp_path):
    proc = start_cli(tmp_path, "-m", *ON_THE_NODE, *_server(mlflow_server, "slurm-requeue"), *LONG, env=slurm.env)
    try:
        _wait_until_training(tmp_path, proc)
        (job,) = [line.split()[0] for line in slurm.queue()]
        slurm.run("scontrol", "requeue", job)  # SIGTERM now, SIGKILL KillWait (10 s) later, then a new start
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    _, (run,) = _runs(client, "slurm-requeue")
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["slurm_restart_count"] == "1"  # the second start of the same SLURM job ended it
    assert "interrupted_at_step" not in tags and "failure_reason" not in tags
    logs = _job_logs(tmp_path)
    assert "stopped by SIGTERM at step" in logs
    assert f"requeue   this job started again: it continues its run {run.info.run_id}" in logs
    assert _each_step_once(client, run.info.run_id) == list(range(1, LONG_STEPS + 1))


@pytest.mark.slow
def test_a_slurm_pack_near_its_time_limit_is_requeued_and_continues_its_runs(slurm, mlflow_server, tmp_path):
    """Issue 32: a pack of K members that SLURM signals as its time limit nears (submitit's USR2, as
    `#SBATCH --signal` sends it) stops with its checkpoint, is requeued by submitit and continues its K
    runs, every step once. (`scontrol requeue`'s SIGTERM takes the same way back: previous_attempt.)"""
    pack = ["seed=0,1", "pack=2", "data.n_samples=2048", "trainer.max_epochs=60"]  # 26 steps an epoch
    proc = start_cli(tmp_path, "-m", *ON_THE_NODE, *_server(mlflow_server, "slurm-pack"), *pack, env=slurm.env)
    try:
        _wait_until_training(tmp_path, proc)
        (job,) = [line.split()[0] for line in slurm.queue()]
        slurm.run("scancel", "--signal=USR2", job)  # to the job's step: the training process
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    _, runs = _runs(client, "slurm-pack")
    assert len(runs) == 2  # the same two runs, continued
    logs = _job_logs(tmp_path)
    assert "stopped by SIGUSR2 at step" in logs and "Requeued job" in logs  # submitit's own line
    for run in runs:
        assert run.info.status == "FINISHED", run.data.tags.get("failure_reason")
        assert run.data.tags["slurm_restart_count"] == "1" and "interrupted_at_step" not in run.data.tags
        assert f"requeue   this job started again: it continues its run {run.info.run_id}" in logs
        assert _each_step_once(client, run.info.run_id) == list(range(1, 26 * 60 + 1))
