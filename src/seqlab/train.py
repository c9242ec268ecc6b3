"""The training task: plain Python, callable without the CLI (`train(cfg)`): the config built into
its parts, trained, recorded and reported, top to bottom. Heavy: the command line reaches it
through the light seqlab.task, once `sweeps.job.ready` has found the job is to train."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from pytorch_lightning.callbacks import ModelCheckpoint

from seqlab import SeqlabError, ending_status
from seqlab import callbacks as callback_group
from seqlab.ddp.rank_watch import RankWatch, rank_that_died
from seqlab.ddp.ranks import multi_process, process_group_scope, start_ranks_as_this_job
from seqlab.resume.checkpoints import TimedCheckpoint, save_checkpoint
from seqlab.resume.interrupt import GracefulStop, check_checkpoint, start_point
from seqlab.resume.points import CHECKPOINT, publish_resume_point
from seqlab.resume.requeue import previous_attempt
from seqlab.store.ghosts import heartbeat
from seqlab.store.ui import run_link
from seqlab.sweeps.job import Job, JobResult, fmt, ready, resume_command
from seqlab.sweeps.pruning import trial_callbacks
from seqlab.tracking import LightningBridge, StepClock, StepMetricsRecorder
from seqlab.tracking.connect import open_tracker
from seqlab.tracking.costs import PROCESS
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
from seqlab.tracking.model_logging import Kept
from seqlab.training import devices
from seqlab.training.devices import use_cores
from seqlab.training.loop import FusedLoop
from seqlab.training.module import LOSS_TO_MSE, final_metrics
from seqlab.training.noise import quiet_libraries
from seqlab.training.perf import optimizer_factory, steps_per_call
from seqlab.training.trainer import build_trainer

log = logging.getLogger("seqlab")


def train(cfg: DictConfig, job: Optional[Job] = None) -> JobResult:
    """Train one configuration and record it in MLflow. Raises on failure, after the run has
    been ended FAILED (or KILLED) with the reason; returns the result otherwise."""
    job = job or Job(Path(cfg.paths.output_dir))
    done = ready(cfg, job)  # before any data is loaded
    return done if done is not None else fit_job(cfg, job)


def fit_job(cfg: DictConfig, job: Job) -> JobResult:
    """Train a job whose config `ready` (sweeps.job) has checked: its run opened, trained and ended."""
    try:
        device, device_error = devices.resolve(cfg.trainer.accelerator), None
    except SeqlabError as error:
        device, device_error = None, error
    sweep = job.sweep_info()
    tracker = open_tracker(cfg.logger, job, sweep)
    if (
        job.multirun and not cfg.resume and job.rank == 0
    ):  # started again by a cluster (a requeue): its run continues
        cfg.resume = previous_attempt(
            job.output_dir, sweep.sweep_id, tracker.connect(), JobResult.read_if_any
        )
        if cfg.resume:
            job.overrides.append(f"resume={cfg.resume}")
    opening = describe_run(cfg, job, tracker, device, sweep)
    start_from, opening.name = start_point(cfg, job, tracker, opening.params, opening.name)

    # The run's lifecycle is a pack member's (tracking.lifecycle): opened, recorded, ended with its status.
    open_run(tracker, cfg, job, sweep, opening, cfg.resume)
    error = None
    try:
        with heartbeat(tracker):
            record_config(
                cfg, job, tracker, opening.params, continued=bool(cfg.resume), code=opening.code
            )
            if device_error is not None:
                raise device_error
            with process_group_scope(cfg.trainer):
                outcome = _fit(cfg, job, tracker, device, start_from, opening.name)
    except BaseException as failure:
        error = failure
        raise
    finally:
        end_run(tracker, *ending_status(error), job, job.output_dir)
    result = finished_result(cfg, job, tracker, opening, outcome.ending)
    if job.rank == 0:
        _report(job, tracker, result, outcome)
    return result


@dataclass
class Parts:
    """What a job trains with, built from the config (`_build`)."""

    datamodule: Any
    module: Any
    trainer: Any
    callbacks: dict[str, Any]  # the callbacks config group's, by name
    stop: Any  # the graceful stop (interrupt.GracefulStop)
    steps_per_call: int


@dataclass
class Outcome:
    """What training measured, for the job's result and report."""

    parts: Parts
    wall_s: float
    device: Any  # devices.Device: what trained
    ending: (
        Any  # tracking.lifecycle.Ending: the network kept, the final metrics, where the model is
    )


def _fit(
    cfg: DictConfig, job: Job, tracker, device, start_from: Optional[Path], name: str
) -> Outcome:
    """Build, train, evaluate the network kept, save it: the job's work inside its MLflow run."""

    quiet_libraries(cfg.perf.loader)
    use_cores(device, cfg.deterministic, job.cpu_share())
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    parts = _build(cfg, job, tracker, device)
    baseline = parts.datamodule.baseline_val_rmse()
    model = parts.module.model
    log.info("data      %s", parts.datamodule.describe())
    if (
        job.rank == 0
    ):  # the training and validation sets as the run's dataset inputs (the UI's Dataset column)
        log_training_data(
            tracker,
            cfg.data,
            parts.datamodule,
            resumed=bool(cfg.resume),
            data_changed=cfg.resume_data == "changed",
        )
    log.info(
        "model     %s, %s parameters, init=%s",
        type(model).__name__,
        f"{sum(p.numel() for p in model.parameters()):,}",
        cfg.model.init,
    )
    log.info(
        "device    %s (%s); perf=%s, %d step(s) per call",
        device.accelerator,
        device.name,
        cfg.perf.name,
        parts.steps_per_call,
    )
    log.info(
        "mlflow    run %s (%s) in experiment '%s'", tracker.run_id, name, tracker.experiment_name
    )
    if start_from is not None:
        check_checkpoint(
            start_from,
            parts.module,
            f"resume={cfg.resume}" if cfg.resume else f"ckpt_path={cfg.ckpt_path}",
        )
        log.info("resume    from %s", start_from)

    tracker.start_system_metrics()
    start = time.perf_counter()
    _fit_or_stop(parts, job, tracker, start_from)
    wall = time.perf_counter() - start
    tracker.costs.training_s = wall
    # The network the final metrics and the model are of (module.output_network): before any
    # BatchNorm finalisation.
    callbacks = parts.callbacks
    best, to_target = callbacks.get("best"), callbacks.get("time_to_target")
    step = parts.trainer.global_step
    kept = best.restore(parts.module.model, step) if best is not None else Kept("last", step)
    timer = callbacks.get("timer")
    summary = final_metrics(
        parts.module.model,
        cfg.module.loss,
        cfg.module.bn_statistics,
        parts.datamodule,
        parts.module.device,
        wall,
        timer.median if timer is not None else lambda key: None,
        baseline,
    )
    reached = to_target.reached if to_target is not None and to_target.target is not None else None
    ending = Ending(
        parts.module.model,
        parts.datamodule.train.x,
        kept,
        summary,
        step,
        job.output_dir / "checkpoints" / "last.ckpt",
        baseline,
        best=best.best if best is not None else None,
        best_weights=best.weights if best is not None else None,
        logged=best.logged if best is not None else [],
        time_to_target_s=reached["time_to_target_s"] if reached else None,
        pruned=next(
            (c.pruned for c in parts.trainer.callbacks if getattr(c, "pruned", None)), None
        ),
    )
    save_checkpoint(
        parts.trainer, ending.checkpoint
    )  # atomically; every process takes part, rank 0 writes
    if job.rank == 0:
        record_end(tracker, job, name, ending)
    return Outcome(parts, wall, device, ending)


def _build(cfg: DictConfig, job: Job, tracker, device) -> Parts:
    """The data module, the LightningModule with its training loop, the callbacks and the Trainer,
    each from its config group."""

    perf, ddp = cfg.perf, multi_process(cfg.trainer)
    with PROCESS.phase("data and networks"):
        datamodule = instantiate(cfg.data)
        datamodule.setup("fit")
    has_val = datamodule.has_val()
    # The fused loop: K optimizer steps per Lightning call (see perf.steps_per_call). DDP
    # synchronises gradients in each backward of its wrapped forward: one step per call, the
    # path Lightning's DDP is built for.
    fused = perf.steps_per_call > 1 and not ddp
    val_every = cfg.trainer.val_check_interval if has_val else None
    k, val_every = (
        steps_per_call(perf.steps_per_call, len(datamodule.train_dataloader()), val_every)
        if fused
        else (1, val_every)
    )
    if ddp:
        start_ranks_as_this_job(job.output_dir, job.overrides)
        log.info(
            "ddp       %s process(es) per node x %d node(s); one step per call; data sharded per process",
            cfg.trainer.devices,
            cfg.trainer.num_nodes,
        )
    datamodule.configure_batching(perf.loader, perf.data_on_device, k)
    graphs = (
        fused
        and device.accelerator == "gpu"
        and str(perf.cuda_graph).lower() not in ("off", "false")
    )
    to_mse, n_outputs = (
        LOSS_TO_MSE[cfg.module.loss],
        datamodule.n_outputs,
    )  # read once: config lookups are slow
    recorder = StepMetricsRecorder(
        tracker,
        tracker.flush_every_n_steps,
        lambda loss: to_mse(loss, n_outputs),
        every_s=0.0 if ddp else tracker.flush_every_s,
    )
    module = instantiate(cfg.module)(
        model=instantiate(cfg.model, n_features=datamodule.n_features, n_outputs=n_outputs),
        optimizer=optimizer_factory(
            instantiate(cfg.optimizer), perf.optimizer_impl, capturable=graphs
        ),
        scheduler=instantiate(cfg.scheduler)
        if cfg.scheduler and "_target_" in cfg.scheduler
        else None,
        step_log=recorder.steps,
        # The default training loop (seqlab.training.loop); None: Lightning's automatic optimisation (perf=naive, DDP).
        loop=partial(
            FusedLoop,
            batch_size=cfg.data.batch_size,
            exact_shortcuts=perf.exact_shortcuts,
            cuda_graph=str(perf.cuda_graph),
            clip_val=cfg.trainer.gradient_clip_val,
        )
        if fused
        else None,
        loss_on_progress_bar=perf.progress == "bar",
    )
    clock = StepClock()
    # Ctrl-C/SIGTERM, and every checkpoint.interval_s, a checkpoint that resume=RUN_ID continues from
    # (not under DDP, where the processes would have to agree on the moment).
    stop = GracefulStop(job.output_dir / "checkpoints" / CHECKPOINT, enabled=not ddp)
    own = [clock, recorder, stop]
    if cfg.checkpoint.interval_s > 0 and not ddp:
        own.append(
            TimedCheckpoint(
                job.output_dir / "checkpoints" / CHECKPOINT,
                cfg.checkpoint.interval_s,
                partial(publish_resume_point, tracker),
                before_save=recorder.flush,
            )
        )
    chosen = callback_group.build(cfg.callbacks, tracker=tracker)
    # Epoch checkpoints off (perf.checkpoint_every_n_epochs=0, the default): Lightning would still
    # keep the callback's state in every checkpoint and warn about its folder on each resume.
    chosen = {
        k: c
        for k, c in chosen.items()
        if not (isinstance(c, ModelCheckpoint) and not c.every_n_epochs)
    }
    # DDP: the other ranks' processes, watched from rank 0 (a rank that dies: one line naming it)
    watch = [RankWatch.installed(job.output_dir, tracker)] if ddp and job.rank == 0 else []
    every = [*own, *watch, *chosen.values(), *trial_callbacks(tracker)]
    trainer = build_trainer(
        cfg, device, every, LightningBridge(tracker, clock), fused, has_val, val_every
    )
    tracker.set_tags({"torch_threads": torch.get_num_threads()})
    return Parts(datamodule, module, trainer, chosen, stop, k)


def _fit_or_stop(parts: Parts, job: Job, tracker, start_from: Optional[Path]) -> None:
    """trainer.fit; on Ctrl-C or SIGTERM the graceful stop saved a checkpoint: it goes to the run,
    with the command that continues it."""

    trainer, stop = parts.trainer, parts.stop
    try:
        trainer.fit(parts.module, datamodule=parts.datamodule, ckpt_path=start_from)
    except BaseException as error:
        died = rank_that_died(trainer, error)
        if died is not None:
            raise died from None  # another rank died: the line that names it, not rank 0's lost collective
        if stop.saved is not None and job.rank == 0:
            publish_resume_point(tracker, stop.saved, trainer.global_step)
            then = f"continue with:\n  {resume_command(job.overrides, tracker.run_id)}"
            if stop.preempted() is not None:
                then = "the job is requeued and continues this run"
            elif job.multirun and os.environ.get(
                "SLURM_JOB_ID"
            ):  # scontrol requeue, or scancel: SIGTERM says not which
                then = f"if SLURM requeued the job, it continues this run by itself; else {then}"
            log.error(
                "stopped by %s at step %d (epoch %d); checkpoint %s; %s",
                stop.signal,
                trainer.global_step,
                trainer.current_epoch + 1,
                stop.saved,
                then,
            )
        if stop.signal == "SIGINT":
            raise KeyboardInterrupt from None  # Ctrl-C took Lightning's SIGTERM path to stop cleanly
        preempted = stop.preempted()
        if preempted is not None:
            raise preempted from None  # the job is requeued once its run has ended (seqlab.task._main_job)
        raise


def _report(job: Job, tracker, result: JobResult, outcome: Outcome) -> None:
    trainer, device = outcome.parts.trainer, outcome.device
    which = (
        "the final network"
        if result.output_network == "last"
        else f"the {result.output_network.replace('best', 'best network', 1)}"
    )
    lines = [
        f"done      {result.run_name}: {trainer.current_epoch} epochs, {trainer.global_step} steps in {outcome.wall_s:.1f} s",
        f"val_rmse  {fmt(result.val_rmse)} (predicting the mean: {fmt(result.val_rmse_baseline)}), "
        f"val_mae {fmt(tracker.last('final_val_mae'))}, val_r2 {fmt(tracker.last('final_val_r2'), '.3f')} "
        f"({which}, as saved)",
        f"speed     {fmt(result.it_per_s, ',.0f')} it/s, {fmt(result.samples_per_s, ',.0f')} samples/s "
        f"(median over epochs) on {device.accelerator} ({device.name})",
        f"mlflow    run {tracker.run_id} in experiment '{tracker.experiment_name}' at {tracker.tracking_uri}",
    ]

    # A parallel sweep's jobs log through a loopback server over the local store, gone after the sweep.
    store = job.sweep_info().store_uri if tracker.is_server else tracker.tracking_uri
    if str(store).startswith("sqlite:"):
        lines.append(
            f"          see it: make ui, then {run_link(tracker.experiment_id, tracker.run_id)}"
        )
    elif tracker.is_server:
        lines.append(
            f"          see it: {run_link(tracker.experiment_id, tracker.run_id, base=tracker.tracking_uri)}"
        )
    if result.model_uri:
        which = (
            f"model={result.model_uri}"
            if result.model_uri.startswith("models:/")
            else f"run={tracker.run_id}"
        )
        lines.append(f"model     {result.model_uri} (predict: python predict.py {which} data=...)")
    lines.append(f"outputs   {job.output_dir} (config.yaml, checkpoints/, training_curves.png)")
    for line in lines:
        log.info(line)
