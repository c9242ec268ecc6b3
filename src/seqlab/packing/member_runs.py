"""The MLflow run of each member of a job (issues 22 and 32), a run alone's and a pack member's alike:
`open_runs` opens each one (or continues it, on a resume) with its params, tags and config, and
`log_datasets` adds its training and validation sets once the data is loaded; `finish_or_fail`
ends a member FINISHED with its final metrics, checkpoint and model, or FAILED where it failed (its
loss diverged, its own run refused a write); `stopped` marks the training ones KILLED at a signal,
and `close` ends whatever the job leaves open. Each end writes the member's result file (`ended`).
The training itself is seqlab.train's."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import mlflow
import torch

from seqlab import ending_status, one_line
from seqlab.callbacks.timing import target_tags
from seqlab.packing.members import Member
from seqlab.resume.checkpoints import save_checkpoint
from seqlab.resume.interrupt import prepare_resume
from seqlab.resume.points import fetch_checkpoint
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
from seqlab.tracking.senders import Undelivered
from seqlab.training.evaluation import final_metrics

log = logging.getLogger("seqlab")


def open_runs(
    job: Job, members: list[Member], stack: ExitStack, device: Any, pack_size: Optional[int] = None
) -> Optional[Path]:
    """Each member's run opened (continued, where it has resume_run_id: its config checked against
    the run's, what its server had not stored sent first); the checkpoint a continued job starts
    from, fetched once (a pack's members share one). A DDP job's other processes fetch their own.
    `pack_size`: the pack's, where `members` are some of it (a trial taking a freed slot)."""
    sweep = job.sweep_info()
    checkpoint = None
    pack_size = pack_size or len(members)
    pack = pack_size > 1
    reaped = set()  # the stores whose dead runs a member's connecting ended (Tracker.reap)
    code = {}  # the code's state as read for the first member under each project root
    for m in members:
        if m.ended_before:
            continue  # its run stays as it ended
        m.tracker = open_tracker(m.cfg.logger, m.job, sweep)
        # Once per store and job: each reaping reads every RUNNING run of the store, and a pack's
        # own members are among them (at K = 32, 0.03 s of each member's start here).
        m.tracker.reap = m.tracker.tracking_uri not in reaped
        reaped.add(m.tracker.tracking_uri)
        m.opening = describe_run(
            m.cfg,
            m.job,
            m.tracker,
            device,
            sweep,
            # The code as git saw it for the pack's first member: its members start at one
            # moment (three git commands a member otherwise).
            code.get(m.cfg.paths.root_dir),
            **(
                dict(pack_id=m.job.pack_id, pack_size=str(pack_size), pack_member=str(m.k))
                if pack
                else {}
            ),
            torch_threads=str(torch.get_num_threads()),
            **(m.trial_link.tags() if m.trial_link else {}),
        )
        if m.resume_run_id and job.rank == 0:
            fetched = prepare_resume(
                m.tracker.connect(),
                m.resume_run_id,
                m.opening.params,
                m.job.output_dir / "resume",
                fetch=checkpoint is None,
            )
            checkpoint = checkpoint or fetched
            m.opening.name = m.tracker.client.get_run(m.resume_run_id).info.run_name
        elif m.resume_run_id:  # under SLURM the processes start together, maybe on other hosts
            client = mlflow.MlflowClient(m.tracker.tracking_uri)
            checkpoint = fetch_checkpoint(
                client, m.resume_run_id, m.job.output_dir / "resume" / f"rank{job.rank}"
            )
        m.name = m.opening.name
        code.setdefault(m.cfg.paths.root_dir, m.opening.code)
        # The journal in the member's folder: a server's backlog that kill -9 cut off is sent by the resume.
        open_run(m.tracker, m.cfg, m.job, sweep, m.opening, m.resume_run_id)
        stack.enter_context(heartbeat(m.tracker))
        if job.rank == 0 and m.trial_link is not None:
            m.trial = open_trial(m.trial_link)
        record_config(
            m.job,
            m.tracker,
            m.opening.params,
            m.opening.config,
            continued=m.resume_run_id is not None,
            code=m.opening.code,
        )
    # The members' trials live while this process trains them, whatever becomes of the sweeper (sweeps.workers).
    trials = [m.trial for m in members if m.trial is not None]
    if trials:
        stack.callback(trainer_heartbeat(trials).stop)
    return checkpoint


def log_datasets(m: Member, data_changed: bool) -> None:
    """The member's training and validation sets (its data module set up) as its run's dataset
    inputs (the UI's Dataset column)."""
    if not m.run_open or m.job.rank != 0:
        return
    log_training_data(
        m.tracker,
        m.cfg.data,
        m.datamodule,
        resumed=m.resume_run_id is not None,
        data_changed=data_changed,
    )


def stopped(members: list[Member], signal: str, step: int) -> None:
    """A signal stopped training, its checkpoint published: the training members' runs end KILLED
    (their ExitStack, seqlab.train), with the step."""
    for m in members:
        if m.active:
            m.status, m.reason = "KILLED", f"stopped by {signal} at step {step}"


def finish_or_fail(m: Member, model: Any, trainer: Any, device: Any, wall: float) -> JobResult:
    """The member's run ended as its job alone ends it (FINISHED; FAILED where it failed); where its
    own run refuses (deleted in the UI, an upload its store refuses), that member ends FAILED and
    the pack's other members still end theirs. Its own validation set is split again for its end
    (its training set too where its end takes a pass over it), and dropped after it."""
    if m.job.result is not None and m.job.result.status != "RUNNING":
        return m.job.result  # its run ended where it stopped, or before this start of the pack
    if m.status != "FAILED":
        # What its end scores: the validation set, and the training set only where BatchNorm's
        # population statistics take a pass over it (module.bn_statistics).
        population = m.cfg.module.bn_statistics == "population"
        m.datamodule.setup("fit" if population else "validate")
    try:
        return _finish(m, model, trainer, device, wall)
    except Undelivered as error:  # its end waits for its store: its result is written (ended)
        log.error("member %d: %s", m.k, error)
        return m.job.result
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


def _finish(m: Member, model: Any, trainer: Any, device: Any, wall: float) -> JobResult:
    """The member's run as its job alone ends it: the network kept, final metrics, checkpoint,
    curves, model, status; its result."""
    tracker, cfg = m.tracker, m.cfg
    tracker.costs.training_s = wall  # the job's, to this member's end
    if m.status == "FAILED":
        return ended(m)
    step = m.own_step(m.final_step or trainer.global_step)  # as its run counts its steps
    weights, kept = m.kept(model.member(m.k), trainer.global_step)
    m.network.load_state_dict(weights)
    # In single precision, as the data: trainer.precision=64-true trains a double network, and
    # what a run keeps and is scored by is the network a float32 input predicts with.
    m.network.to(device.torch_device, torch.float32)
    baseline = m.datamodule.baseline_val_rmse()
    # On every DDP process: torchmetrics gathers the processes' states for its result.
    summary = final_metrics(
        m.network,
        cfg.module.loss,
        cfg.module.bn_statistics,
        m.datamodule,
        device.torch_device,
        wall,
        baseline,
    )
    checkpoint = _save_checkpoint(m, model, trainer, step)
    if m.job.rank != 0:  # rank 0 speaks for a DDP job
        return JobResult("FINISHED", m.job.num, None, m.job.overrides)
    k = model.n_members
    timing = m.timing()  # its rates' medians over the epochs it trained
    if timing is not None:
        summary["it_per_s_median"] = timing.it_per_s
        summary["samples_per_s_median"] = timing.samples_per_s
        if k > 1:  # the pack's networks trained per second (the comparison's model-steps/s)
            summary["pack_model_steps_per_s_median"] = k * timing.it_per_s
    tags = {}
    if cfg.metrics.target_rmse is not None:  # callbacks.timing.TimeToTarget's, at the run's end
        tags = target_tags(cfg.metrics.target_rmse, m.reached)
    ending = Ending(
        m.network,
        m.datamodule.example_x,
        kept,
        summary,
        step,
        checkpoint,
        baseline,
        best=m.best,
        best_weights=m.best_weights,
        logged=m.logged,
        time_to_target_s=m.reached.time_to_target_s if m.reached else None,
        pruned=m.pruned,
        tags=tags,
    )
    record_end(tracker, m.job, m.name, ending)
    m.status = "FINISHED"
    result = finished_result(cfg, m.job, tracker, m.opening, ending)
    ended(m, result)
    if m.job.member is not None:
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


def _save_checkpoint(m: Member, model: Any, trainer: Any, step: int) -> Path:
    """The member's last.ckpt, its network as it ends (after its final metrics)."""
    checkpoint = m.job.output_dir / "checkpoints" / "last.ckpt"
    if model.n_members == 1:
        # A run alone's is the job's own checkpoint: its network kept, as its final metrics scored
        # it (after BatchNorm's population pass, module.bn_statistics; a pack of one holds the
        # network's own state dict), the optimizer state and loops of the last step, so that
        # ckpt_path= trains on from it. Every DDP process takes part; rank 0 writes.
        save_checkpoint(trainer, checkpoint)
    elif m.job.rank == 0:
        # A pack member's: its network as a Lightning checkpoint's state_dict (what predict and a
        # model's checkpoint artifact read); its optimizer state is in the pack's checkpoint.
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "state_dict": {f"model.{k}": v.cpu() for k, v in m.network.state_dict().items()},
                "global_step": step,
                "epoch": m.own_epoch(trainer.current_epoch),
                "pack_id": m.job.pack_id,
                "pack_member": m.job.member,
            },
            checkpoint,
        )
    return checkpoint


def _fmt(value: Any, spec: str = ".4g") -> str:
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
    job_dir = m.job.output_dir.parent if m.job.member is not None else m.job.output_dir
    try:
        end_run(tracker, m.status, m.reason, m.job, job_dir)  # a pack's members share its files
    finally:
        m.job.write(result)  # whatever its run did, the sweep reads the member's result
    return result


def close(members: list[Member], error: Optional[BaseException]) -> None:
    """Runs the job leaves open (an error, Ctrl-C, a stop): ended KILLED or FAILED, each result written."""
    for m in members:
        if (
            m.tracker is None
            or m.tracker.run_id is None
            or (m.job.result is not None and m.job.result.status != "RUNNING")
        ):
            continue  # never opened, or ended already
        if m.status == "RUNNING":
            m.status, reason = (
                ending_status(error) if error is not None else ("FAILED", "the job ended")
            )
            m.reason = m.reason or reason
        try:
            ended(m)
        except Exception as failure:  # noqa: BLE001 - every member's run gets its end
            log.error("member %d: its run could not be ended: %s", m.k, one_line(failure))
