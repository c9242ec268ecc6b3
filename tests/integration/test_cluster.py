"""Past one machine, for real: sweeps as SLURM jobs on a one-node cluster (the `slurm` fixture,
tests/slurm_cluster.py), a DDP job of two SLURM tasks, and a job alone and a pack stopped mid-run by
the cluster (scontrol requeue) that continue their own MLflow runs. Without SLURM: tests/integration/test_preemption.py.
Each sweep here is a sbatch and fresh Pythons on the node: the sweep of array tasks is checked on the
requeue test's sweep, not run again on its own."""

from __future__ import annotations

import mlflow
from conftest import start_cli
from harness.cluster import (
    BOTH,
    BOTH_STEPS,
    _each_step_once,
    _job_logs,
    _runs,
    _stop_each_once_training,
)

# Jobs of one CPU each, so the two-core node runs two at once; small enough for any node.
ON_THE_NODE = [
    "hydra/launcher=slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=1",
    "trainer.accelerator=cpu",
    "logger.system_metrics=false",
]


def _server(mlflow_server, experiment: str) -> list[str]:
    return [
        "logger=mlflow_server",
        f"logger.tracking_uri={mlflow_server.uri}",
        f"logger.experiment_name={experiment}",
    ]


def test_a_ddp_job_of_two_slurm_tasks(slurm, mlflow_server, run_process, tmp_path):
    proc = run_process(
        "-m",
        *ON_THE_NODE,
        *_server(mlflow_server, "slurm-ddp"),
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "data.n_samples=256",
        "trainer.max_epochs=2",
        env=slurm.env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    (parent,), (run,) = _runs(client, "slurm-ddp")  # one run: rank 0 tracks, rank 1 only trains
    assert run.info.status == parent.info.status == "FINISHED"
    # Two processes, each a half of the 205 training samples: 2 steps of 64 an epoch, not 4.
    assert _each_step_once(client, run.info.run_id) == [1, 2, 3, 4]
    logs = _job_logs(tmp_path)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in logs and "GLOBAL_RANK: 1, MEMBER: 2/2" in logs
    assert (
        len(list(tmp_path.glob("logs/multiruns/*/.submitit/*/*_1_log.out"))) == 1
    )  # task 1 of the job


def test_a_requeued_slurm_job_and_pack_continue_their_runs(slurm, mlflow_server, tmp_path):
    """scontrol requeue of a job alone and of a pack (issue 32): each continues its own runs, every step once.
    The same sweep is the check of a sweep as SLURM jobs: an array of tasks from one sbatch, each task a
    job's runs under the sweep's parent, and the summary and comparison as a local sweep prints them."""
    proc = start_cli(
        tmp_path, "-m", *ON_THE_NODE, *_server(mlflow_server, "slurm-requeue"), *BOTH, env=slurm.env
    )
    try:
        # Each array task: SIGTERM now, SIGKILL KillWait (10 s) later, then a new start.
        _stop_each_once_training(
            tmp_path, proc, 2, lambda job: slurm.run("scontrol", "requeue", job)
        )
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    client = mlflow.MlflowClient(mlflow_server.uri)
    (parent,), runs = _runs(client, "slurm-requeue")
    assert (
        len(runs) == 3 and sum("pack_id" in r.data.tags for r in runs) == 2
    )  # the same runs, continued
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    assert {r.data.params["seed"] for r in runs} == {"0", "1", "2"}
    # Each job an array task of one SLURM job (the pack's two members one task), the jobs' own processes on the node.
    jobs = {r.data.tags["slurm_job_id"] for r in runs}
    assert len(jobs) == 2 and len({j.split("_")[0] for j in jobs}) == 1, jobs
    assert len({r.data.tags["slurm_job_id"] for r in runs if "pack_id" in r.data.tags}) == 1
    # The summary and the comparison, as a local sweep prints them.
    # (the pack's two members are one configuration's repeats, the job alone another's: packed speeds differ)
    assert (
        "3 jobs, 0 failed" in out
        and "verdict: n = 1-2 repeats per configuration (seeds 0, 1, 2)" in out
    )
    sweep_dir = next(tmp_path.glob("logs/multiruns/*"))
    assert (sweep_dir / "sweep_summary.csv").read_text().count("FINISHED") == 3
    assert (
        len(list(sweep_dir.glob(".submitit/*/*_submission.sh"))) == 1
    )  # one sbatch, an array of 2
    logs = _job_logs(tmp_path)
    assert logs.count("stopped by SIGTERM at step") >= 2  # the job alone and the pack
    for run in runs:
        tags = run.data.tags
        assert run.info.status == "FINISHED", tags.get("failure_reason")
        assert tags["slurm_restart_count"] == "1"  # the second start of the same SLURM job ended it
        assert "interrupted_at_step" not in tags and "failure_reason" not in tags
        assert f"requeue   this job started again: it continues its run {run.info.run_id}" in logs
        assert _each_step_once(client, run.info.run_id) == list(range(1, BOTH_STEPS + 1))
