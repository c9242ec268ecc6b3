"""The search's MLflow side: its trials' runs in the jobs' store, the parent run the sweep callback
opened, and a job's own result file where a run cannot tell (a job that failed before its run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import mlflow

from seqlab.sweeps.job import JOB_FILE, JobResult, SweepInfo
from seqlab.sweeps.packs import member_dir


def job_result(ret: Any, member: Optional[int] = None) -> Optional[JobResult]:
    """The job's own result file (seqlab_job.json), a pack member's in its folder, if it got as far as writing one."""
    try:
        out = Path(ret.hydra_cfg.hydra.runtime.output_dir)
        out = (member_dir(out, member) if member is not None else out) / JOB_FILE
        return JobResult.read(out) if out.is_file() else None
    except Exception:  # noqa: BLE001 - a job that failed to compose has no hydra_cfg
        return None


class Tracking:
    """The sweep's MLflow side: the jobs' store (or the sweep's loopback server over it) and the
    parent run the sweep callback opened."""

    def __init__(self, sweep: SweepInfo) -> None:

        self.client = mlflow.MlflowClient(sweep.tracking_uri)
        # The parent run is written to the store itself (the callback's choice, see seqlab.sweeps.callback).
        self.parent_client = mlflow.MlflowClient(sweep.store_uri or sweep.tracking_uri)
        self.parent_run_id = sweep.parent_run_id
        self.experiment_id = sweep.experiment_id

    def runs_of(self, study: str, number: Optional[int] = None) -> list:
        query = f"tags.optuna_study = '{study}'" + (
            f" and tags.optuna_trial = '{number}'" if number is not None else ""
        )
        return self.client.search_runs(
            [self.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=5000
        )

    def run_of(self, study: str, number: int) -> Any:
        runs = self.runs_of(study, number)
        return runs[0] if runs else None

    def tag(self, run_id: str, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, str(value))

    def kill(self, study: str, number: int) -> None:
        for run in self.runs_of(study, number):
            if run.info.status == "RUNNING":  # a job in another process (joblib) that was not told
                self.client.set_terminated(run.info.run_id, "KILLED")
            self.client.set_tag(run.info.run_id, "trial_state", "FAIL")
