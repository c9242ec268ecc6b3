"""Stopping cleanly and continuing. Ctrl-C or SIGTERM stops training at the next step boundary
and saves a checkpoint that holds everything the rest of the run depends on (weights, optimizer
and scheduler state, loop counters, the random streams and the position in the epoch's sample
order); `resume=RUN_ID` continues that MLflow run from it, and `ckpt_path=FILE` starts a new run
from a checkpoint."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

import mlflow
import pytorch_lightning as pl
import torch
from mlflow.exceptions import MlflowException
from pytorch_lightning.utilities.exceptions import SIGTERMException

from seqlab import SeqlabError
from seqlab.delivery.journal import deliver_journal
from seqlab.resume.checkpoints import save_checkpoint
from seqlab.resume.points import CHECKPOINT, STOPPED_AT, deliver_unsent, fetch_checkpoint
from seqlab.resume.requeue import Preempted, preempt_signal
from seqlab.training.lightning_private import request_stop

log = logging.getLogger("seqlab")

# Keys that may differ between an interrupted run and its resumption: where things go, not what
# is trained.
_MAY_DIFFER = ("paths.", "logger.", "resume", "ckpt_path", "notes", "trainer.max_time")


class GracefulStop(pl.Callback):
    """SIGTERM: Lightning stops at the end of the running step (SIGTERMException). Ctrl-C is made
    to do the same; a second Ctrl-C stops at once, without a checkpoint. In a submitit job (SLURM),
    so is submitit's time-limit/preemption signal (SIGUSR2), after which the job is requeued
    (seqlab.resume.requeue). The checkpoint is saved when Lightning reports the stop, at that step
    boundary.

    Single-process training only (`enabled`): under DDP each process decides on its own signal
    and a checkpoint needs them all at one barrier, so there Lightning's own handling stays."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self.signal: Optional[str] = None  # SIGINT | SIGTERM | SIGUSR2, once one arrived
        self.saved: Optional[Path] = None
        self._trainer: Optional[pl.Trainer] = None
        self._previous: Any = None
        self._submitit: Any = (
            None  # submitit's own handler of its preemption signal, called once the run has ended
        )
        self._preempt = preempt_signal()
        self._deferred = False  # a stop waiting for the end of the epoch

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            if self._preempt is not None:
                self._submitit = signal.signal(self._preempt, self._on_preempt)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = "SIGINT"
        log.warning(
            "stopping after this step to save a checkpoint (Ctrl-C again stops at once, without one)"
        )
        # Lightning's graceful stop: it ends the loop at the next step boundary.
        request_stop(self._trainer)

    def _on_preempt(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            log.warning(
                "%s: the job is preempted or near its time limit; stopping after this step to save a "
                "checkpoint, then the job is requeued and continues this run",
                self.signal,
            )
            request_stop(self._trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # A stop that lands on the epoch's last batch waits for the epoch's end (its validation,
        # scheduler step and epoch metrics): Lightning resumes an epoch-end checkpoint exactly,
        # but not one taken between the last batch and the epoch's end.
        if (
            self.enabled
            and trainer.received_sigterm
            and batch_idx + 1 >= trainer.num_training_batches
        ):
            request_stop(trainer, False)
            self._deferred = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._deferred:
            self._deferred = False
            request_stop(trainer)  # Lightning stops once the epoch is closed

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self._submitit is not None:
            signal.signal(self._preempt, self._submitit)

    def preempted(self) -> Optional[Preempted]:
        """After a stop on submitit's signal: what requeues the job once its run has ended."""
        if (
            self._submitit is None
            or self.signal != signal.Signals(self._preempt).name
            or not callable(self._submitit)
        ):
            return None
        return Preempted(self._preempt, self._submitit)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        if self.enabled and isinstance(exception, SIGTERMException):
            self.signal = self.signal or "SIGTERM"
            save_checkpoint(
                trainer, self.path
            )  # a temporary name, then a rename: never a part of one
            self.saved = self.path

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()


def check_checkpoint(path: Path, module: torch.nn.Module, what: str) -> None:
    """One line, before training, for a file that is not a checkpoint of this model. Loaded as
    tensors and plain types only (weights_only, as Lightning then loads it): a checkpoint someone
    else could write (a shared folder, a store's artifacts) runs no code here (issue 34)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch errors alike
        if "Weights only load failed" in str(error):
            raise SeqlabError(
                f"{what}: the checkpoint holds more than tensors and plain values (loading it could run "
                "code): not loaded; use a checkpoint this project wrote"
            ) from None
        raise SeqlabError(
            f"{what}: not a PyTorch Lightning checkpoint ({type(error).__name__})"
        ) from None
    state = checkpoint.get("state_dict") if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        raise SeqlabError(f"{what}: not a PyTorch Lightning checkpoint (no state_dict)")
    expected = module.state_dict()
    for key, tensor in expected.items():
        if key not in state:
            raise SeqlabError(
                f"{what}: the checkpoint has no {key}: it was saved from another model"
            )
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise SeqlabError(
                f"{what}: the checkpoint is for another model shape ({key} is {list(state[key].shape)} there, "
                f"{list(tensor.shape)} here); train with the model settings it was saved with"
            )
    extra = sorted(set(state) - set(expected))
    if extra:
        raise SeqlabError(
            f"{what}: the checkpoint has {extra[0]}, which this model lacks: it was saved from another model"
        )


def prepare_resume(
    client: Any, run_id: str, params: Mapping[str, str], dst: Path, fetch: bool = True
) -> Optional[Path]:
    """Check that `run_id` can be continued with this config, send what it had not stored, and
    fetch its checkpoint (`fetch`: a pack's members share one, fetched once)."""

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise SeqlabError(f"resume={run_id}: no such run in this tracking store") from None
    if run.info.status == "FINISHED":
        raise SeqlabError(f"resume={run_id}: that run finished; there is nothing to continue")
    if run.info.status == "RUNNING":  # the store's dead runs were ended KILLED when it was opened
        tags = run.data.tags
        owner = (
            f" (pid {tags['process_pid']} on {tags.get('process_host')})"
            if tags.get("process_pid")
            else ""
        )
        raise SeqlabError(
            f"resume={run_id}: that run is still running{owner}; stop it first (Ctrl-C), then resume it"
        )
    if (
        STOPPED_AT not in run.data.tags
    ):  # set with each checkpoint, cleared when the run's training ends
        raise SeqlabError(
            f"resume={run_id}: the run's last stop saved no checkpoint (a second Ctrl-C, or a crash or kill -9 "
            "before its first time-based checkpoint, checkpoint.interval_s); "
            "start it again, or give ckpt_path=FILE"
        )
    differ = [
        f"{key}={value} (the run had {run.data.params[key]})"
        for key, value in params.items()
        if not key.startswith(_MAY_DIFFER)
        and key in run.data.params
        and run.data.params[key] != value[:6000]
    ]
    if differ:
        overrides = run.data.tags.get("hydra_overrides", "")
        raise SeqlabError(
            f"resume={run_id}: this config differs from the run's: {'; '.join(differ[:3])}; "
            f"give the run's overrides: {overrides or '(none)'} resume={run_id}"
        )
    try:
        checkpoint = fetch_checkpoint(client, run_id, dst) if fetch else None
    except (MlflowException, OSError):
        raise SeqlabError(
            f"resume={run_id}: the run has no checkpoints/{CHECKPOINT} (one is saved when Ctrl-C or SIGTERM stops training)"
        ) from None
    # Before the run reopens (its stored steps decide what is logged again): what the run's
    # server had not stored when its checkpoint was published, and what a process killed outright
    # journaled in its folder and the server never confirmed.
    sent = deliver_unsent(client, run_id, dst)
    folder = run.data.params.get("paths.output_dir")
    sent += (
        deliver_journal(client.tracking_uri, run_id, Path(folder))
        if folder and Path(folder).is_dir()
        else 0
    )
    if sent:
        log.info("resume    %d metric value(s) the run had not stored were sent first", sent)
    return checkpoint


def start_point(
    cfg: Any, job: Any, tracker: Any, params: Mapping[str, str], name: str
) -> tuple[Optional[Path], str]:
    """The checkpoint a job (seqlab.sweeps.job.Job) starts training from (None: from scratch):
    ckpt_path=FILE, or resume=RUN_ID's, checked against this config; and the run's name (a
    resumed run keeps its own)."""
    if not cfg.resume:
        return (Path(cfg.ckpt_path) if cfg.ckpt_path else None), name
    if job.rank == 0:  # before the run reopens: a resume that cannot work changes nothing
        start_from = prepare_resume(
            tracker.connect(), cfg.resume, params, job.output_dir / "resume"
        )
        return start_from, tracker.client.get_run(cfg.resume).info.run_name
    # Each process fetches its own copy (under SLURM they start together, maybe on other hosts).

    client = mlflow.MlflowClient(tracker.tracking_uri)
    return fetch_checkpoint(client, cfg.resume, job.output_dir / "resume" / f"rank{job.rank}"), name
