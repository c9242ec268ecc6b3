"""A sweep job that a cluster stops and starts again continues its own MLflow run.

Two ways a SLURM job is stopped early, and what each sends:
- its time limit, or a preemption that submitit hears of: submitit asks SLURM for SIGUSR2 a while
  before the limit (`hydra.launcher.signal_delay_s`; USR2 because NCCL takes USR1). submitit's
  own handler would checkpoint and requeue in the middle of a step; here the job stops at the next
  step boundary instead, saves its checkpoint, ends its run KILLED, and only then calls submitit's
  handler, which requeues the job through the launcher's `checkpoint` method
  (`hydra.launcher.max_num_timeout` requeues at most);
- `scontrol requeue`, a preemption with PreemptMode=REQUEUE, `scancel`: SLURM sends SIGTERM (which
  submitit ignores) and kills the job KillWait seconds later (30 s by default). Lightning's SIGTERM
  path stops at the step boundary and saves the checkpoint; SLURM has requeued the job itself.

The job started again (same sweep folder, same job number) finds its last attempt's result file
and continues that run from its checkpoint (`previous_attempt`). Light imports only."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any, Callable, Optional

from seqlab import one_line
from seqlab.delivery.journal import deliver_journal
from seqlab.resume.points import STOPPED_AT
from seqlab.secrets import mask_text

log = logging.getLogger("seqlab")

SLURM_JOB, SLURM_ATTEMPT = "slurm_job_id", "slurm_restart_count"


def scheduler_tags() -> dict[str, str]:
    """Which SLURM job (and which start of it) a run belongs to; nothing outside SLURM."""
    job = (
        os.environ.get("SLURM_ARRAY_JOB_ID")
        and f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    )
    job = job or os.environ.get("SLURM_JOB_ID")
    return (
        {SLURM_JOB: job, SLURM_ATTEMPT: os.environ.get("SLURM_RESTART_COUNT", "0")} if job else {}
    )


def preempt_signal() -> Optional[int]:
    """The signal submitit sends before a time limit or on preemption, when this process is a
    submitit job (SLURM or submitit's local executor); None otherwise."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}", None)


class Preempted(SystemExit):
    """Training stopped at a step boundary on submitit's signal; once the run has ended KILLED,
    `requeue()` hands the job back to submitit, which requeues it (and exits this process)."""

    def __init__(self, signum: int, handler: Callable[[int, Any], Any]) -> None:
        super().__init__(128 + signum)
        self.signum, self.handler = signum, handler

    def requeue(self) -> None:
        self.handler(self.signum, None)  # submitit: checkpoint() -> scontrol requeue -> sys.exit


def previous_attempt(
    output_dir: Path, sweep_id: Optional[str], client: Any, read_result: Callable[[Path], Any]
) -> Optional[str]:
    """The run this job's last attempt left behind, when this is the same job of the same sweep
    started again (its result file is in the job's folder): its id if it has a checkpoint to
    continue from, else None (the job trains anew). A run the last attempt left RUNNING is ended
    KILLED when it provably belongs to an earlier start of this SLURM job (SLURM starts a requeued
    job only once the earlier one has ended): the heartbeat rule would wait minutes for a run
    whose node is gone."""
    before = read_result(output_dir)
    if (
        before is None
        or before.sweep_id != sweep_id
        or not before.run_id
        or before.status == "FINISHED"
    ):
        return None
    from mlflow.exceptions import MlflowException  # a requeued job only (every job imports us)

    try:
        run = client.get_run(before.run_id)
    except MlflowException:
        return None  # deleted meanwhile: start anew
    tags, now = run.data.tags, scheduler_tags()
    if run.info.status == "RUNNING":
        earlier = (
            now
            and tags.get(SLURM_JOB) == now[SLURM_JOB]
            and int(tags.get(SLURM_ATTEMPT, "0")) < int(now[SLURM_ATTEMPT])
        )
        if not earlier:
            log.warning(
                "requeue   run %s of this job's last attempt is still RUNNING: this attempt trains anew",
                run.info.run_id,
            )
            return None
        reason = f"SLURM job {now[SLURM_JOB]} was requeued before the run ended (start {tags.get(SLURM_ATTEMPT, '0')})"
        try:
            # What the earlier start journaled and its store never confirmed, stored before the
            # run ends (as the reaper and resume= deliver it): this attempt may train anew.
            deliver_journal(client.tracking_uri, run.info.run_id, output_dir)
            client.set_tag(run.info.run_id, "failure_reason", mask_text(reason))
            client.set_terminated(run.info.run_id, "KILLED")
        except MlflowException as refused:
            log.warning(
                "requeue   run %s cannot be ended from here (%s): this attempt trains anew",
                run.info.run_id,
                one_line(refused),
            )
            return None
    if STOPPED_AT not in tags:
        log.info(
            "requeue   run %s of this job's last attempt saved no checkpoint: this attempt trains anew",
            run.info.run_id,
        )
        return None
    log.info(
        "requeue   this job started again: it continues its run %s (%s) from step %s",
        run.info.run_id,
        run.info.run_name,
        tags[STOPPED_AT],
    )
    return run.info.run_id
