"""The Hydra task of train.py, light: one job's result file, exit status and one-line errors, and
what decides whether it trains at all (`sweeps.job.ready`), before torch, Lightning and MLflow load
(`python train.py --help` and `--cfg job` never come here; a resumed sweep's finished job comes here
and leaves). The training itself, a job alone's and a pack's, is seqlab.train's."""

from __future__ import annotations

import logging
from typing import Optional

from omegaconf import DictConfig

from seqlab import SeqlabError, ending_status, imports_without_gc, one_line
from seqlab.hydra_version import trusted_targets
from seqlab.resume.requeue import Preempted
from seqlab.sweeps.job import Job, JobResult, ready
from seqlab.tracking.costs import PROCESS, job_starts

log = logging.getLogger("seqlab")


def main(cfg: DictConfig) -> Optional[float]:
    """Hydra's task function. A single run that fails exits non-zero with one line (a traceback
    only for unexpected errors); in a multirun, a failed job is recorded and the sweep goes on:
    the sweep callback prints the summary and sets the exit code."""
    with trusted_targets():  # a launcher's worker process comes here without the command line's
        return _task(cfg)


def _task(cfg: DictConfig) -> Optional[float]:
    job_starts()  # what its bookkeeping costs, from here (tracking.costs)
    job = Job.from_hydra(cfg)
    if (
        cfg.get("replicas", 1) != 1 and not job.multirun
    ):  # the sweeper makes the replicas of a multirun's jobs
        log.error(
            "error: replicas=%s trains a job's config as a pack, which a multirun makes: python train.py -m "
            "replicas=%s ...",
            cfg.replicas,
            cfg.replicas,
        )
        raise SystemExit(1)
    if cfg.get("pack_job") is not None:  # a pack of a multirun (seqlab.packing)
        return _pack_job(cfg, job)
    return _main_job(cfg, job)


def _pack_job(cfg: DictConfig, job: Job) -> None:
    """A pack's job: its members trained together, each its own run. A failure ends every member's
    run and writes its result; the sweep goes on and its summary reports it."""
    try:
        with PROCESS.phase("imports"), imports_without_gc("seqlab.train"):
            from seqlab.train import fit_pack  # heavy (torch, Lightning, MLflow): only for training

        fit_pack(cfg, job)
    except Preempted as error:
        log.error("preempted: the pack's runs ended KILLED; the job is requeued and continues them")
        error.requeue()  # submitit requeues the job and ends this process
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as error:
        # A DDP pack's other process: its exit status tells rank 0 (ddp.rank_watch).
        if job.rank > 0:
            raise
        if isinstance(error, SeqlabError):
            log.error("error: %s", one_line(error))
        else:  # each member's run has been ended and its result written
            log.exception("pack failed: %s", one_line(error))


def _main_job(cfg: DictConfig, job: Job) -> Optional[float]:
    try:
        if cfg.get("rerun"):
            from seqlab.rerun import (  # MLflow and git: only a rerun reads its run first
                rerun_config,
            )

            cfg, job = rerun_config(cfg, job)
        result = ready(
            cfg, job
        )  # light: a job a resumed sweep's plan says is done is skipped without torch
        if result is None:
            with PROCESS.phase("imports"), imports_without_gc("seqlab.train"):
                from seqlab.train import (  # heavy (torch, Lightning, MLflow): only for a job that trains
                    fit_job,
                )

            result = fit_job(cfg, job)
    except BaseException as error:  # noqa: BLE001 - recorded, then re-raised or reported
        status = ending_status(error)[
            0
        ]  # as its run ended: KILLED also for a full disk (resumable)
        result = job.result or JobResult(status, job.num, job.sweep_info().sweep_id, job.overrides)
        result.status, result.reason = status, one_line(error)
        job.write(result)
        if isinstance(error, Preempted):
            log.error(
                "preempted: MLflow run %s ended KILLED; the job is requeued and continues it",
                result.run_id,
            )
            error.requeue()  # submitit requeues the job and ends this process
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            log.error("interrupted: MLflow run %s ended KILLED", result.run_id or "(none yet)")
            # The shell's convention, 128 + the signal: Lightning turns SIGTERM into an exit
            # with status 0, which would read as success.
            sigterm = type(error).__name__ == "SIGTERMException" or (
                isinstance(error, SystemExit) and error.code == 143
            )
            raise SystemExit(143 if sigterm else 130) from None
        if isinstance(error, SeqlabError):
            log.error("error: %s", result.reason)
        else:
            log.exception("job failed: %s", result.reason)
        if not job.multirun:
            raise SystemExit(1) from None
        return None
    job.write(result)
    return result.val_rmse
