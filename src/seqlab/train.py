"""The training task: plain Python, callable without the CLI (`train(cfg)`), and the Hydra entry
glue (`main`). Heavy imports happen inside the functions so `train.py --help` stays instant."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from seqlab import SeqlabError, one_line, sweep
from seqlab.job import Job, JobResult, fmt, routed_tracking_uri
from seqlab.schema import validate

log = logging.getLogger("seqlab")

# Overrides already shown by the first part of a run name, or that say where, not what.
_NAME_SKIP = ("trainer.accelerator", "data.batch_size", "logger.", "paths.", "hydra.")


def run_name(accelerator: str, cfg: DictConfig, overrides: list[str], swept: Optional[list[str]] = None) -> str:
    """Names say what differs: cpu-bs64, gpu-bs256-optimizer=sgdm, ... In a sweep, only the
    swept keys count (what differs between its runs); in a single run, every override."""
    parts = [accelerator, f"bs{cfg.data.batch_size}"]
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if swept is not None and key not in swept:
            continue
        if not key.startswith(_NAME_SKIP) and key not in _NAME_SKIP:
            parts.append(f"{key.split('.')[-1]}={value}")
    return "-".join(parts)[:250]


def _git_commit(root: Path) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _run_tags(cfg: DictConfig, job: Job, device) -> dict[str, str]:
    import mlflow
    import pytorch_lightning
    import torch

    tags = {
        "accelerator_requested": cfg.trainer.accelerator,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "none",
        "lightning_version": pytorch_lightning.__version__,
        "mlflow_version": mlflow.__version__,
        "host": socket.gethostname(),
        "hydra_overrides": " ".join(job.overrides),
        "data": cfg.data.name,
        "mlflow.source.name": "train.py",
        "mlflow.source.type": "LOCAL",
    }
    if device is not None:
        tags.update(accelerator=device.accelerator, device_name=device.name)
    commit = _git_commit(Path(cfg.paths.root_dir))
    if commit:
        tags["git_commit"] = tags["mlflow.source.git.commit"] = commit
    return tags


def train(cfg: DictConfig, job: Optional[Job] = None) -> JobResult:
    """Train one configuration and record it in MLflow. Raises on failure, after the run has
    been ended FAILED (or KILLED) with the reason; returns the result otherwise."""
    job = job or Job(Path(cfg.paths.output_dir))
    validate(cfg)  # before anything heavy is imported or any data is loaded
    if cfg.resume:
        from seqlab.sweep import check_single_run_resume, continue_job

        if job.multirun:  # resume=latest|<sweep id>: the sweep's plan says what this job does
            done = continue_job(cfg, job)
            if done is not None:
                return done
        else:
            check_single_run_resume(cfg.resume)

    from hydra.utils import instantiate

    from seqlab import devices

    try:
        device, device_error = devices.resolve(cfg.trainer.accelerator), None
    except SeqlabError as error:
        device, device_error = None, error
    tracker = instantiate(cfg.logger)
    if job.rank > 0:
        tracker = tracker.silenced()  # rank 0 records the job
        log.setLevel(logging.WARNING)  # and reports it
    sweep = job.sweep_info()
    routed = routed_tracking_uri(sweep, tracker.tracking_uri)
    if routed != tracker.tracking_uri:
        from seqlab.server import wait_until_up

        # The sweep's own server may still be starting.
        wait_until_up(routed, timeout_s=120, log_path=job.sweep_dir / "mlflow_server.log")
        tracker.tracking_uri = routed
    name = tracker.run_name or run_name(
        device.accelerator if device else cfg.trainer.accelerator, cfg, job.overrides, sweep.get("swept_keys")
    )
    parent = sweep.get("parent_run_id") if sweep.get("tracking_uri") == tracker.tracking_uri else None
    tags = _run_tags(cfg, job, device)
    if job.multirun:
        tags.update(sweep_id=sweep.get("sweep_id", job.sweep_dir.name), job_num=str(job.num))
        from seqlab.trial import trial_tags

        tags.update(trial_tags())  # a search's trial: its study, number and state
    result = JobResult("RUNNING", job.num, tags.get("sweep_id"), job.overrides,
                       accelerator=tags.get("accelerator"), batch_size=cfg.data.batch_size)
    job.result = result
    from seqlab.tracking import flatten

    params = flatten(cfg)
    start_from = Path(cfg.ckpt_path) if cfg.ckpt_path else None
    if cfg.resume:
        from seqlab.interrupt import prepare_resume

        if job.rank == 0:  # before the run reopens: a resume that cannot work changes nothing
            start_from = prepare_resume(tracker.connect(), cfg.resume, params, job.output_dir / "resume")
            name = tracker.client.get_run(cfg.resume).info.run_name
        else:  # each process fetches its own copy (under SLURM they start together, maybe on other hosts)
            import mlflow

            from seqlab.interrupt import fetch_checkpoint

            client = mlflow.MlflowClient(tracker.tracking_uri)
            start_from = fetch_checkpoint(client, cfg.resume, job.output_dir / "resume" / f"rank{job.rank}")

    with tracker.run(name, tags, parent_run_id=parent, description=cfg.notes, resume_run_id=cfg.resume):
        result.run_id, result.run_name = tracker.run_id, name
        job.write(result)
        try:
            if not cfg.resume:  # a resumed run has them, and MLflow keeps a param's first value
                tracker.log_params(params)
            elif job.rank == 0:
                from seqlab.interrupt import STOPPED_AT

                tracker.client.delete_tag(tracker.run_id, STOPPED_AT)  # this checkpoint is being used up
            _save_config(cfg, job.output_dir / "config.yaml")
            tracker.log_artifact(job.output_dir / "config.yaml")
            if device_error is not None:
                raise device_error
            with _process_group_scope(cfg.trainer):
                _fit(cfg, job, tracker, device, result, start_from)
        finally:
            tracker.log_artifact(job.output_dir / ".hydra", "hydra")
            for log_file in job.output_dir.glob("*.log"):
                tracker.log_artifact(log_file)
    result.status = "FINISHED"
    return result


def _save_config(cfg: DictConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))


def _fit(cfg: DictConfig, job: Job, tracker, device, result: JobResult, start_from: Optional[Path] = None) -> None:
    import pytorch_lightning as pl
    import torch
    from hydra.utils import instantiate

    from pytorch_lightning.callbacks import ModelCheckpoint

    from seqlab.interrupt import CHECKPOINT, STOPPED_AT, GracefulStop, check_checkpoint, resume_command
    from seqlab.loop import FusedLoop
    from seqlab.module import LOSS_TO_MSE, evaluate, population_bn_statistics_
    from seqlab.output_network import OutputNetwork
    from seqlab.perf import optimizer_factory, steps_per_call
    from seqlab.plots import training_curves
    from seqlab.progress import ProgressLine
    from seqlab.timing import EpochTimer, TimeToTarget
    from seqlab.tracking import StepMetricsRecorder
    from seqlab.trial import trial_callbacks

    # Lightning's INFO lines (device tables, checkpoint notes) repeat what the report says.
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    # Its warnings repeat what the outbox says once when a tracking server goes away.
    logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
    # Noise that says nothing to a user of this project: an internal deprecation in Lightning,
    # and a hint about step-level self.log calls, which this module does not make.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval")
    # The module marks host-to-device copies for the profiler and defers to Lightning for the rest.
    warnings.filterwarnings("ignore", message=r".*overridden `transfer_batch_to_device` in `LightningModule`")
    # Under DDP: the epoch metrics are torchmetrics states, which synchronise across processes
    # themselves, and every process validates on the whole validation set.
    warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting")
    if cfg.perf.loader == "tensor":
        # The data module saves and restores the position in the epoch's order (data.module),
        # which Lightning does not see on the loader itself. (A DataLoader's is not saved: there
        # the warning stands.)
        warnings.filterwarnings("ignore", message=r".*your dataloader is not resumable")
    if device.accelerator == "gpu":
        torch.backends.cudnn.benchmark = not cfg.deterministic
    if job.concurrent_jobs > 1:
        # Jobs running side by side share the cores: each takes its part instead of all of them
        # (torch's default), which would oversubscribe the machine and slow every job down.
        from seqlab.job import cpu_count

        torch.set_num_threads(max(1, cpu_count() // job.concurrent_jobs))
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    perf = cfg.perf
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")
    baseline = datamodule.baseline_val_rmse()
    log.info("data      %s", datamodule.describe())
    if job.rank == 0:  # the training and validation sets as the run's dataset inputs (the UI's Dataset column)
        from seqlab.datasets import log_training_data

        log_training_data(tracker, cfg.data, datamodule)
    model = instantiate(cfg.model, n_features=datamodule.n_features, n_outputs=datamodule.n_outputs)
    scheduler = instantiate(cfg.scheduler) if cfg.scheduler and "_target_" in cfg.scheduler else None

    # The fused loop: K optimizer steps per Lightning call (see perf.steps_per_call).
    batches = len(datamodule.train_dataloader())
    val_check_interval = cfg.trainer.val_check_interval if datamodule.has_val() else None
    fused = perf.steps_per_call > 1 and not multi_process(cfg.trainer)
    k, val_check_interval = (
        steps_per_call(perf.steps_per_call, batches, val_check_interval) if fused else (1, val_check_interval)
    )
    if multi_process(cfg.trainer):
        # DDP synchronises gradients in each backward of its wrapped forward: one optimizer
        # step per Lightning call, the path Lightning's DDP is built for.
        _start_ranks_as_this_job(job)
        log.info("ddp       %s process(es) per node x %d node(s); one step per call; data sharded per process",
                 cfg.trainer.devices, cfg.trainer.num_nodes)
    datamodule.configure_batching(perf.loader, perf.data_on_device, k)
    graphs = fused and device.accelerator == "gpu" and str(perf.cuda_graph).lower() not in ("off", "false")
    to_mse, n_outputs = LOSS_TO_MSE[cfg.module.loss], datamodule.n_outputs  # read once: config lookups are slow
    recorder = StepMetricsRecorder(tracker, tracker.flush_every_n_steps, lambda loss: to_mse(loss, n_outputs),
                                   every_s=0.0 if multi_process(cfg.trainer) else tracker.flush_every_s)
    # The default training loop (seqlab.loop), k steps per Lightning call; otherwise (perf=naive,
    # DDP) Lightning's automatic optimisation, one step per call.
    loop = None
    if fused:
        loop = partial(FusedLoop, batch_size=cfg.data.batch_size, exact_shortcuts=perf.exact_shortcuts,
                       cuda_graph=str(perf.cuda_graph), clip_val=cfg.trainer.gradient_clip_val)
    module = instantiate(cfg.module)(
        model=model,
        optimizer=optimizer_factory(instantiate(cfg.optimizer), perf.optimizer_impl, capturable=graphs),
        scheduler=scheduler,
        step_log=recorder.steps,
        loop=loop,
        loss_on_progress_bar=perf.progress == "bar",
    )
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model     %s, %s parameters, init=%s", type(model).__name__, f"{n_params:,}", cfg.model.init)
    log.info("device    %s (%s); perf=%s, %d step(s) per call", device.accelerator, device.name, perf.name, k)
    log.info("mlflow    run %s (%s) in experiment '%s'", tracker.run_id, result.run_name, tracker.experiment_name)

    if start_from is not None:
        check_checkpoint(start_from, module, f"resume={cfg.resume}" if cfg.resume else f"ckpt_path={cfg.ckpt_path}")
        log.info("resume    from %s", start_from)
    stop = GracefulStop(job.output_dir / "checkpoints" / CHECKPOINT, enabled=not multi_process(cfg.trainer))
    timer = EpochTimer(tracker)
    # best_val_rmse and its step/epoch (a comparison can rank by it); the network kept
    # (module.output_network) and early stopping (module.validation_patience)
    best = OutputNetwork(tracker, cfg.module.output_network, cfg.module.validation_patience)
    callbacks = [timer, recorder, stop, best]
    to_target = None
    if cfg.metrics.target_rmse is not None:
        to_target = TimeToTarget(timer, cfg.metrics.target_rmse, tracker)
        callbacks.append(to_target)
    callbacks += trial_callbacks(tracker, result)  # a search's trial: report each epoch, prune
    if perf.profile_steps:
        from seqlab.profiling import ProfileSteps

        callbacks.append(ProfileSteps(perf.profile_steps, job.output_dir / "profile", tracker))
    if perf.progress == "line" and job.rank == 0:
        callbacks.append(ProgressLine(timer))
    if perf.checkpoint_every_n_epochs:
        callbacks.append(
            ModelCheckpoint(
                dirpath=job.output_dir / "checkpoints",
                filename="epoch{epoch:03d}",
                every_n_epochs=perf.checkpoint_every_n_epochs,
                save_top_k=-1,
                auto_insert_metric_name=False,
            )
        )
    trainer = pl.Trainer(
        accelerator=device.accelerator,
        devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy,
        num_nodes=cfg.trainer.num_nodes,
        max_epochs=cfg.trainer.max_epochs,
        max_steps=cfg.trainer.max_steps,
        max_time=cfg.trainer.max_time,
        precision=cfg.trainer.precision,
        gradient_clip_val=None if fused else cfg.trainer.gradient_clip_val,  # the loop clips itself
        check_val_every_n_epoch=cfg.trainer.check_val_every_n_epoch if datamodule.has_val() else 1,
        val_check_interval=val_check_interval,
        num_sanity_val_steps=cfg.trainer.num_sanity_val_steps,
        deterministic=cfg.deterministic,
        logger=tracker.lightning_logger(),
        callbacks=callbacks,
        log_every_n_steps=tracker.flush_every_n_steps,
        enable_progress_bar=perf.progress == "bar",
        # Per-epoch checkpoints cost more than an epoch of this model: by default one, at the end.
        enable_checkpointing=bool(perf.checkpoint_every_n_epochs),
        enable_model_summary=False,
        default_root_dir=str(job.output_dir),
        **({} if datamodule.has_val() else {"limit_val_batches": 0}),
        **OmegaConf.to_container(cfg.trainer.extra, resolve=True),
    )
    tracker.set_tags({"torch_threads": torch.get_num_threads()})
    tracker.start_system_metrics()
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=start_from)
    except BaseException:
        if stop.saved is not None and job.rank == 0:
            tracker.log_artifact(stop.saved, "checkpoints")
            tracker.set_tags({STOPPED_AT: trainer.global_step})
            log.error("stopped by %s at step %d (epoch %d); checkpoint %s; continue with:\n  %s",
                      stop.signal, trainer.global_step, trainer.current_epoch + 1, stop.saved,
                      resume_command(job.overrides, tracker.run_id))
        if stop.signal == "SIGINT":
            raise KeyboardInterrupt from None  # Ctrl-C took Lightning's SIGTERM path to stop cleanly
        raise
    wall = time.perf_counter() - start
    kept = best.restore(module.model, trainer.global_step)  # the network the final metrics and the model are of
    tracker.set_tags(kept)
    result.output_network = kept["output_network"] + (
        f" (step {kept['output_network_step']})" if kept["output_network"] == "best" else "")

    if cfg.module.bn_statistics == "population":
        population_bn_statistics_(module.model, datamodule.train_eval_batches(), module.device)
        log.info("batchnorm population statistics from one pass over the %d training samples", len(datamodule.train))
    summary = {"train_wall_s": wall}
    val_batches = datamodule.val_dataloader()
    if val_batches:
        # MATLAB's FinalValidation*: the network as saved, after any BatchNorm finalisation.
        final = evaluate(module, val_batches, module.device)
        summary.update({f"final_val_{k}": v for k, v in final.items()})
    for key in ("it_per_s", "samples_per_s"):
        value = timer.median(key)
        if value is not None:
            summary[f"{key}_median"] = value
    if baseline is not None:
        summary["val_rmse_baseline"] = baseline
    tracker.log_metrics(summary, trainer.global_step)

    ckpt = job.output_dir / "checkpoints" / "last.ckpt"
    trainer.save_checkpoint(ckpt)  # every process takes part; rank 0 writes
    if job.rank > 0:
        return
    if tracker.log_checkpoint:
        tracker.log_artifact(ckpt, "checkpoints")
    png = training_curves(tracker.history, job.output_dir / "training_curves.png", title=result.run_name)
    tracker.log_artifact(png)
    from seqlab.model_logging import log_network  # the network kept, as an MLflow model

    result.model_uri = log_network(tracker, module.model, datamodule.train.x, trainer.global_step, tracker.register_as,
                                   tags=kept)

    result.it_per_s = summary.get("it_per_s_median")
    result.samples_per_s = summary.get("samples_per_s_median")
    result.val_rmse = summary.get("final_val_rmse", tracker.last("val_rmse"))
    result.val_rmse_baseline = baseline
    result.best_val_rmse = best.value
    if to_target is not None:
        result.target_rmse = cfg.metrics.target_rmse
        result.time_to_target_s = to_target.reached["time_to_target_s"] if to_target.reached else None
    _report(cfg, job, tracker, device, result, trainer, wall)


def multi_process(t: DictConfig) -> bool:
    """Whether the trainer settings start more than one training process (DDP)."""
    devices = t.devices
    one_device = devices in (1, "1") or (OmegaConf.is_list(devices) and len(devices) == 1)
    return t.strategy != "auto" or t.num_nodes > 1 or not one_device


@contextmanager
def _process_group_scope(t: DictConfig) -> Iterator[None]:
    """A DDP job leaves its process group and the launcher's variables (MASTER_PORT, ...) behind;
    the next job of a sweep in the same process would join that dead group. Both end with the job."""
    if not multi_process(t):
        yield
        return
    keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "RANK")
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _start_ranks_as_this_job(job: Job) -> None:
    """Lightning's DDP launcher starts ranks 1..N-1 by running the command line again, which in a
    multirun would start the whole sweep again (and from a launcher's worker, not train.py at
    all). Each rank is started as a single run of this job instead: train.py with the job's
    overrides, in the job's output folder."""
    from hydra.core.hydra_config import HydraConfig
    from pytorch_lightning.strategies.launchers import subprocess_script

    if not HydraConfig.initialized():
        raise SeqlabError(
            "multi-process training (trainer.devices > 1 or trainer.strategy=ddp) starts through the CLI: "
            "python train.py trainer.devices=N trainer.strategy=ddp ..."
        )
    hc = HydraConfig.get()
    entry = os.environ.get("SEQLAB_ENTRY") or str(Path(os.environ.get("SEQLAB_ROOT", ".")) / "train.py")
    # The same config: its name, where it was found, and any added search path.
    config = ["--config-name", hc.job.config_name]
    for source in hc.runtime.config_sources:
        if source.schema == "file" and source.provider in ("main", "command-line"):
            config += ["--config-path" if source.provider == "main" else "--config-dir", source.path]
    config += [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath")]

    def command(local_rank: int) -> tuple[list[str], str]:
        return [
            sys.executable, entry, *config, *job.overrides,
            f'hydra.run.dir="{job.output_dir}"',
            f"hydra.job.name=train_ddp_process_{local_rank}",
            "hydra.output_subdir=null",  # rank 0 wrote .hydra/
        ], hc.runtime.cwd

    subprocess_script._hydra_subprocess_cmd = command


def _kept_text(output_network: Optional[str]) -> str:
    """'the final network', or 'the best network (step N)' (module.output_network)."""
    if not output_network or output_network == "last":
        return "the final network"
    return output_network.replace("best", "the best network", 1)


def _report(cfg, job: Job, tracker, device, result: JobResult, trainer, wall: float) -> None:
    lines = [
        f"done      {result.run_name}: {trainer.current_epoch} epochs, {trainer.global_step} steps in {wall:.1f} s",
        f"val_rmse  {fmt(result.val_rmse)} (predicting the mean: {fmt(result.val_rmse_baseline)}), "
        f"val_mae {fmt(tracker.last('final_val_mae'))}, val_r2 {fmt(tracker.last('final_val_r2'), '.3f')} "
        f"({_kept_text(result.output_network)}, as saved)",
        f"speed     {fmt(result.it_per_s, ',.0f')} it/s, {fmt(result.samples_per_s, ',.0f')} samples/s "
        f"(median over epochs) on {device.accelerator} ({device.name})",
        f"mlflow    run {tracker.run_id} in experiment '{tracker.experiment_name}' at {tracker.tracking_uri}",
    ]
    from seqlab.ui import run_link  # opens the model-training view of the UI

    # A parallel sweep's jobs log through a loopback server over the local store, gone after the sweep.
    store = job.sweep_info().get("store_uri") if tracker.is_server else tracker.tracking_uri
    if str(store).startswith("sqlite:"):
        lines.append(
            f"          see it: make ui, then {run_link(tracker.experiment_id, tracker.run_id)}"
        )
    elif tracker.is_server:
        lines.append(f"          see it: {run_link(tracker.experiment_id, tracker.run_id, base=tracker.tracking_uri)}")
    if result.model_uri:
        which = f"model={result.model_uri}" if result.model_uri.startswith("models:/") else f"run={tracker.run_id}"
        lines.append(f"model     {result.model_uri} (predict: python predict.py {which} data=...)")
    lines.append(f"outputs   {job.output_dir} (config.yaml, checkpoints/, training_curves.png)")
    for line in lines:
        log.info(line)


def main(cfg: DictConfig) -> Optional[float]:
    """Hydra's task function. A single run that fails exits non-zero with one line (a traceback
    only for unexpected errors); in a multirun, a failed job is recorded and the sweep goes on:
    the sweep callback prints the summary and sets the exit code."""
    job = Job.from_hydra(cfg)
    try:
        result = train(cfg, job)
    except BaseException as error:  # noqa: BLE001 - recorded, then re-raised or reported
        status = "KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED"
        result = job.result or JobResult(status, job.num, job.sweep_info().get("sweep_id"), job.overrides)
        result.status, result.reason = status, one_line(error)
        job.write(result)
        if status == "KILLED":
            sweep.interrupted = True
            log.error("interrupted: MLflow run %s ended KILLED", result.run_id or "(none yet)")
            # The shell's convention, 128 + the signal: Lightning turns SIGTERM into an exit
            # with status 0, which would read as success.
            sigterm = type(error).__name__ == "SIGTERMException" or (isinstance(error, SystemExit) and error.code == 143)
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
