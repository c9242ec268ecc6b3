"""A run's lifecycle, written once for every member of a job (seqlab.train: a run alone is a job of
one member, a pack's members each a run): what it opens with, its opening, its end's records and its
result, and its end with a status. Each job is a pack of K >= 1 runs; these are the steps every one
of them takes, in this order (seqlab.packing.member_runs):

    describe_run -> open_run -> (record_config, datasets, training) -> record_end -> end_run
    (-> report: a run alone's lines at its end)

A failure on the way ends the run with `seqlab.ending_status(error)`: KILLED for an interruption
(or a stop it continues from: a full disk), FAILED with the reason otherwise; never RUNNING."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from seqlab import ending_status
from seqlab.plots import series_to_draw
from seqlab.resume.points import drop_resume_point, store_checkpoint
from seqlab.store.ghosts import identity
from seqlab.store.ui import run_link
from seqlab.sweeps.job import Job, JobResult, SweepInfo, fmt
from seqlab.tracking import costs
from seqlab.tracking.describe import resolved, run_name, run_params, run_tags
from seqlab.tracking.model_logging import Kept, log_networks
from seqlab.tracking.provenance import CodeState, code_state
from seqlab.tracking.records import Best

log = logging.getLogger("seqlab")


@dataclass
class Opening:
    """What a run opens with (seqlab.tracking.describe): its name, tags and params."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    code: CodeState  # the project's code as git saw it at the start: its tags and its code/ artifacts agree
    config: dict[str, Any]  # the config resolved once (describe.resolved): params and config.yaml


def describe_run(
    cfg: DictConfig,
    job: Job,
    tracker: Any,
    device: Any,
    sweep: SweepInfo,
    code: Optional[CodeState] = None,
    **more_tags: str,
) -> Opening:
    """The run's name (the logger's, else made from what the job sets), its tags (with the
    process that owns it: a run it leaves RUNNING is found and ended) and its params. `code`: the
    project's code as git saw it a moment ago (a pack's first member's), else read here."""
    accelerator = device.accelerator if device is not None else cfg.trainer.accelerator
    name = tracker.run_name or run_name(accelerator, cfg, job.overrides, sweep.swept_keys)
    if code is None:
        with tracker.costs.phase("code and environment"):
            # Read once: the run's tags and its code/ artifacts agree.
            code = code_state(Path(cfg.paths.root_dir))
    config = resolved(cfg)
    params = run_params(cfg, config)  # every resolved key flattened and masked: once a run
    return Opening(
        name,
        {**run_tags(cfg, job, device, sweep, code, params), **identity(), **more_tags},
        params,
        code,
        config,
    )


def open_run(
    tracker: Any,
    cfg: DictConfig,
    job: Job,
    sweep: SweepInfo,
    opening: Opening,
    resume_run_id: Optional[str],
) -> None:
    """The run started (continued: `resume_run_id`), a child of its sweep's run where both are in one
    store, its journal in the job's folder; then the job's result says RUNNING with the run's id,
    so that a sweep (and an error's path) knows its run."""
    parent = sweep.parent_run_id if sweep.tracking_uri == tracker.tracking_uri else None
    tracker.start(
        opening.name,
        opening.tags,
        parent_run_id=parent,
        description=cfg.notes,
        resume_run_id=resume_run_id,
        journal_dir=job.output_dir,
    )
    try:
        job.write(
            JobResult(
                "RUNNING",
                job.num,
                opening.tags.get("sweep_id"),
                job.overrides,
                tracker.run_id,
                opening.name,
                accelerator=opening.tags.get("accelerator"),
                batch_size=cfg.data.batch_size,
            )
        )
    except BaseException as error:  # a full disk: the run is not left RUNNING
        tracker.end(*ending_status(error))
        raise


@dataclass
class Ending:
    """What a run that trained to its end leaves: the network it keeps and which one that is, its
    final metrics, its checkpoint, and what its callbacks found (best validation, time to target,
    a search's pruning)."""

    network: Any  # the network kept, with its weights loaded
    example_x: (
        Any  # the first training inputs: the logged model's signature and example, the ONNX check
    )
    kept: Kept
    summary: dict[str, float]  # training.module.final_metrics, and the job's own
    step: int  # where the run's training ended: its final metrics' step
    checkpoint: Path  # last.ckpt in the job's folder, written
    baseline: Optional[float] = None  # val_rmse of predicting the training mean
    best: Optional[Best] = None  # the lowest val_rmse and its step and epoch
    best_weights: Optional[dict[str, Any]] = None
    logged: list[tuple[str, int]] = field(
        default_factory=list
    )  # logger.log_checkpoints=all: (model id, step)
    time_to_target_s: Optional[float] = None
    pruned: Optional[str] = None  # why a search's pruner stopped it
    tags: dict[str, Any] = field(
        default_factory=dict
    )  # the end's own (the target's), with the kept network's
    model_uri: Optional[str] = None  # where record_end logged the network kept


def record_end(tracker: Any, job: Job, title: str, ending: Ending) -> None:
    """The end's records, in the run: which network it keeps, the final metrics, the checkpoint as
    an artifact (logger.log_checkpoint), the training curves, the networks as MLflow models; and no
    resume point any more (training went to its end: nothing is left to continue)."""
    spent = tracker.costs
    with spent.phase("final records"):
        tracker.set_tags({**ending.tags, **ending.kept.tags()})  # one store call
        tracker.log_metrics(ending.summary, ending.step)
        # Stored before the figure is asked for: the delivery process draws it, and the models'
        # wait for their metrics (model_logging) would otherwise wait for the drawing too.
        tracker.wait_for_metrics()
    if tracker.log_checkpoint:
        with spent.phase("checkpoint"):
            store_checkpoint(tracker, ending.checkpoint)
    with spent.phase("figures"):  # drawn beside the models (delivery.figures), logged after them
        png = job.output_dir / "training_curves.png"
        figure = tracker.draw_curves(series_to_draw(tracker.history), png, title)
    try:
        with spent.phase("models"):
            logged = log_networks(
                tracker,
                ending.network,
                ending.example_x,
                ending.kept,
                ending.best,
                ending.best_weights,
                ending.logged,
            )
    finally:  # the run keeps its figure, whatever became of its models
        with spent.phase("figures"):
            tracker.log_artifact(figure.wait())
    ending.model_uri = logged.uri if logged else None
    with spent.phase("final records"):
        drop_resume_point(tracker)


def finished_result(
    cfg: DictConfig, job: Job, tracker: Any, opening: Opening, ending: Ending
) -> JobResult:
    """The job's result of a run that trained to its end: what the sweep summary, a search and the
    report read."""
    summary = ending.summary
    return JobResult(
        "FINISHED",
        job.num,
        opening.tags.get("sweep_id"),
        job.overrides,
        tracker.run_id,
        opening.name,
        accelerator=opening.tags.get("accelerator"),
        batch_size=cfg.data.batch_size,
        it_per_s=summary.get("it_per_s_median"),
        samples_per_s=summary.get("samples_per_s_median"),
        val_rmse=summary.get("final_val_rmse", tracker.last("val_rmse")),
        val_rmse_baseline=ending.baseline,
        best_val_rmse=ending.best.value if ending.best else None,
        target_rmse=cfg.metrics.target_rmse,
        time_to_target_s=ending.time_to_target_s,
        reason=ending.pruned,
        output_network=ending.kept.name,
        model_uri=ending.model_uri,
    )


def end_run(tracker: Any, status: str, reason: Optional[str], job: Job, job_dir: Path) -> None:
    """The job's own files (Hydra's composed config and overrides, its log: `job_dir`, a pack's for
    its members) into the run, whatever became of it; then the run ended with its status (and the
    reason, as failure_reason); then what its bookkeeping cost, in its own folder (tracking.costs)."""
    try:
        with tracker.costs.phase("end"):
            try:
                tracker.log_artifact(job_dir / ".hydra", "hydra")
                for log_file in job_dir.glob("*.log"):
                    tracker.log_artifact(log_file)
            finally:
                tracker.end(status, reason)
    finally:
        if job.rank == 0:
            costs.write(job.output_dir, tracker.costs, job.num, job.pack_id)


def report(
    job: Job, tracker: Any, result: JobResult, trainer: Any, device: Any, wall: float
) -> None:
    """A run alone's report, at its end: what it trained, how well, how fast, where it went."""
    which = (
        "the final network"
        if result.output_network == "last"
        else f"the {result.output_network.replace('best', 'best network', 1)}"
    )
    lines = [
        f"done      {result.run_name}: {trainer.current_epoch} epochs, {trainer.global_step} steps in {wall:.1f} s",
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
