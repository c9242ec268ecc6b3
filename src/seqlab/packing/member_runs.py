"""The MLflow runs of a pack's members (issue 22), opened and ended as each member's job alone opens
and ends its own: `open_runs` opens each one (or continues it, on a resume) with its params, tags,
config and datasets; `finish_or_fail` ends a member FINISHED with its final metrics, checkpoint and
model, or FAILED where its own run refuses; `stopped` marks the training ones KILLED at a signal, and
`close` ends whatever the pack leaves open. Each end writes the member's result file (`ended`). The
pack's training itself is seqlab.packing.task's."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn, Optional

import torch
from omegaconf import DictConfig

from seqlab import ending_status, one_line
from seqlab.callbacks.timing import target_tags
from seqlab.packing.members import Member
from seqlab.packing.module import PackModule
from seqlab.resume.interrupt import GracefulStop, prepare_resume
from seqlab.store.ghosts import heartbeat
from seqlab.sweeps.job import Job, JobResult
from seqlab.sweeps.trial import open_trial
from seqlab.sweeps.workers import trainer_heartbeat
from seqlab.tracking.connect import open_tracker
from seqlab.tracking.datasets import log_training_data
from seqlab.tracking.describe import record_config
from seqlab.tracking.lifecycle import (
    Ending,
    describe_run,
    end_run,
    finished_result,
    open_run,
    record_end,
)
from seqlab.training.module import final_metrics

log = logging.getLogger("seqlab")


def open_runs(
    cfg: DictConfig, job: Job, members: list[Member], stack: ExitStack, device
) -> Optional[Path]:
    """Each member's run opened (continued, where it has resume_run_id); the pack's checkpoint a
    continued pack starts from."""
    sweep = job.sweep_info()
    checkpoint = None
    for m in members:
        if m.ended_before:
            continue  # its run stays as it ended: FAILED
        m.tracker = open_tracker(m.cfg.logger, m.job, sweep)
        m.opening = describe_run(
            m.cfg,
            m.job,
            m.tracker,
            device,
            sweep,
            pack_id=m.job.pack_id,
            pack_size=str(len(members)),
            pack_member=str(m.k),
            torch_threads=str(torch.get_num_threads()),
            **(m.trial_link.tags() if m.trial_link else {}),
        )
        m.name = m.opening.name
        if m.resume_run_id:
            # A run alone's resume, before the run reopens: the config checked against the run's, what
            # its server had not stored sent first; the pack's one checkpoint fetched once.
            fetched = prepare_resume(
                m.tracker.connect(),
                m.resume_run_id,
                m.opening.params,
                m.job.output_dir / "resume",
                fetch=checkpoint is None,
            )
            checkpoint = checkpoint or fetched
        # The journal in the member's folder: a server's backlog that kill -9 cut off is sent by the resume.
        open_run(m.tracker, m.cfg, m.job, sweep, m.opening, m.resume_run_id)
        stack.enter_context(heartbeat(m.tracker))
        m.trial = open_trial(m.trial_link) if m.trial_link else None
        record_config(
            m.cfg,
            m.job,
            m.tracker,
            m.opening.params,
            continued=m.resume_run_id is not None,
            code=m.opening.code,
        )
        m.datamodule.setup("fit")  # its sets, for their digests, one member at a time
        log_training_data(
            m.tracker,
            m.cfg.data,
            m.datamodule,
            resumed=m.resume_run_id is not None,
            data_changed=cfg.resume_data == "changed",
        )  # the resumed sweep's command line says it
        m.datamodule.release()
    # The members' trials live while this process trains them, whatever becomes of the sweeper (sweeps.workers).
    trials = [m.trial for m in members if m.trial is not None]
    if trials:
        stack.callback(trainer_heartbeat(trials).stop)
    return checkpoint


def stopped(members: list[Member], stop: GracefulStop, step: int) -> NoReturn:
    """A signal stopped the pack, its checkpoint published: the training members' runs end KILLED
    (their ExitStack), then the job is requeued (submitit's USR2: run_pack) or exits 130/143."""
    preempted = stop.preempted()
    for m in members:
        if m.active:
            m.status, m.reason = "KILLED", f"stopped by {stop.signal} at step {step}"
    if preempted is not None:
        then = "the job is requeued and continues these runs"
    elif os.environ.get("SLURM_JOB_ID"):  # scontrol requeue, or scancel: SIGTERM says not which
        then = "if SLURM requeued the job, it continues these runs by itself; else continue the sweep with its command and resume=latest"
    else:
        then = "continue the sweep with its command and resume=latest"
    log.error("stopped by %s at step %d; checkpoint %s; %s", stop.signal, step, stop.saved, then)
    if preempted is not None:
        raise preempted from None  # run_pack requeues the job once every run has ended
    raise SystemExit(130 if stop.signal == "SIGINT" else 143) from None


def finish_or_fail(m: Member, module: PackModule, trainer, device, wall: float) -> JobResult:
    """The member's run ended as its job alone ends it; where its own run refuses (deleted in the UI,
    an upload its store refuses), that member ends FAILED and the pack's other members still end theirs.
    Its own training and validation sets are split again for its end, and dropped after it."""
    if m.job.result is not None and m.job.result.status != "RUNNING":
        return m.job.result  # its run ended where it stopped, or before this start of the pack
    if m.status != "FAILED":
        m.datamodule.setup("fit")
    try:
        return _finish(m, module, trainer, device, wall)
    except Exception as error:  # noqa: BLE001 - one member's run, not the pack's
        m.status = "RUNNING"  # it did not end as FINISHED
        m.fail(f"its MLflow run refused the end of its run: {one_line(error)}")
        try:
            return ended(m)
        except Exception as failure:  # noqa: BLE001 - its result is written all the same (ended)
            log.error("member %d: its run could not be ended: %s", m.k, one_line(failure))
            return m.job.result
    finally:
        m.datamodule.release()


def _finish(m: Member, module: PackModule, trainer, device, wall: float) -> JobResult:
    """The member's run as its job alone ends it: the network kept, final metrics, checkpoint,
    curves, model, status; its result."""
    tracker, cfg = m.tracker, m.cfg
    tracker.costs.training_s = wall  # the pack's, to this member's end
    if m.status == "FAILED":
        return ended(m)
    step = m.final_step or trainer.global_step
    weights, kept = m.kept(module.model.member(m.k), trainer.global_step)
    m.network.load_state_dict(weights)
    m.network.to(device.torch_device)
    baseline = m.datamodule.baseline_val_rmse()
    summary = final_metrics(
        m.network,
        cfg.module.loss,
        cfg.module.bn_statistics,
        m.datamodule,
        device.torch_device,
        wall,
        m.median,
        baseline,
    )
    if (
        m.median("it_per_s") is not None
    ):  # the pack's networks trained per second (the comparison's model-steps/s)
        summary["pack_model_steps_per_s_median"] = len(module.members) * m.median("it_per_s")
    if cfg.metrics.target_rmse is not None:  # callbacks.timing.TimeToTarget's tags, for a run alone
        tracker.set_tags(target_tags(cfg.metrics.target_rmse, m.reached))
    ending = Ending(
        m.network,
        m.datamodule.train.x,
        kept,
        summary,
        step,
        m.job.output_dir / "checkpoints" / "last.ckpt",
        baseline,
        best=m.best,
        best_weights=m.best_weights,
        logged=m.logged,
        time_to_target_s=m.reached["time_to_target_s"] if m.reached else None,
        pruned=m.pruned,
    )
    ending.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    # The member's network as a Lightning checkpoint's state_dict; its optimizer state is in the pack's.
    torch.save(
        {
            "state_dict": {f"model.{k}": v.cpu() for k, v in m.network.state_dict().items()},
            "global_step": step,
            "epoch": trainer.current_epoch,
            "pack_id": m.job.pack_id,
            "pack_member": m.k,
        },
        ending.checkpoint,
    )
    record_end(tracker, m.job, m.name, ending)
    m.status = "FINISHED"
    result = finished_result(cfg, m.job, tracker, m.opening, ending)
    ended(m, result)
    log.info(
        "done      %s (member %d of pack %s): val_rmse %s, best %s, %s it/s (the pack's)",
        m.name,
        m.k,
        m.job.pack_id,
        _fmt(result.val_rmse),
        _fmt(result.best_val_rmse),
        _fmt(result.it_per_s, ",.0f"),
    )
    return result


def _fmt(value, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def ended(m: Member, result: Optional[JobResult] = None) -> JobResult:
    """End the member's run with its status (and reason), its job's artifacts logged; its result written."""
    tracker = m.tracker
    result = result or JobResult(
        m.status,
        m.job.num,
        m.job.sweep_info().sweep_id,
        m.job.overrides,
        m.run_id,
        m.name,
        batch_size=m.cfg.data.batch_size,
        reason=m.reason,
    )
    if (
        m.ended_before
    ):  # its run ended in an earlier start of the pack: a FAILED one's result is written here
        if (
            m.status != "FINISHED"
        ):  # a FINISHED one's was written as it ended (or by the resumed sweep's plan)
            m.job.write(result)
        return m.job.result
    try:
        end_run(
            tracker, m.status, m.reason, m.job, m.job.output_dir.parent
        )  # the pack job's files: its members share them
    finally:
        m.job.write(result)  # whatever its run did, the sweep reads the member's result
    return result


def close(members: list[Member], error: Optional[BaseException]) -> None:
    """Runs the pack leaves open (an error, Ctrl-C, a stop): ended KILLED or FAILED, each result written."""
    for m in members:
        if (
            m.tracker is None
            or m.tracker.run_id is None
            or (m.job.result is not None and m.job.result.status != "RUNNING")
        ):
            continue  # never opened, or ended already
        if m.status == "RUNNING":
            m.status, reason = (
                ending_status(error) if error is not None else ("FAILED", "the pack ended")
            )
            m.reason = m.reason or reason
        try:
            ended(m)
        except Exception as failure:  # noqa: BLE001 - every member's run gets its end
            log.error("member %d: its run could not be ended: %s", m.k, one_line(failure))
