"""The Lightning side of a search's trial: each epoch's val_rmse reported to the trial, and training
stopped at the end of an epoch the pruner gives up on."""

from __future__ import annotations

import logging
from typing import Any, Optional

import optuna
import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from seqlab import one_line
from seqlab.sweeps.trial import PRUNED_AT, TrialLink, current, open_trial
from seqlab.sweeps.workers import trainer_heartbeat

log = logging.getLogger("seqlab")


class TrialReporter(pl.Callback):
    """Reports val_rmse once an epoch (the last validation of the epoch) under the epoch's number,
    so that trials with different batch sizes are compared at the same point, and stops training
    at that epoch's end when the pruner says so: the run then ends as any run does (final metrics,
    checkpoint), tagged trial_state=PRUNED with pruned_at_epoch."""

    def __init__(self, link: TrialLink, tracker: Any) -> None:
        self.link = link
        self.tracker = tracker
        self.pruned: Optional[str] = None  # why the pruner stopped this trial, for the job's result
        self.trial = None
        self.beats = None  # sweeps.workers.Heartbeats: this process's beat of its trial
        self.latest: Optional[float] = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:  # one process speaks for a DDP job
            self.trial = open_trial(self.link)
            # The trial lives while this process trains it, whatever becomes of the sweeper (sweeps.workers).
            self.beats = trainer_heartbeat([self.trial])

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.beats is not None:
            self.beats.stop()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.on_fit_end(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get("val_rmse")
        if value is not None:
            self.latest = float(value)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook.
        epoch = trainer.current_epoch + 1
        value, prune = self.latest, False
        if self.trial is not None and value is not None:
            prune = reported(self.trial, value, epoch, self.link.number)
            if prune is None:
                self.trial = None
        self.latest = None
        if not trainer.strategy.broadcast(
            prune, src=0
        ):  # every DDP process stops at the same epoch
            return
        trainer.should_stop = True
        if self.trial is None:
            return
        n = self.link.number
        self.trial.set_user_attr(PRUNED_AT, epoch)
        self.tracker.log_metrics({PRUNED_AT: float(epoch)}, trainer.global_step)
        self.tracker.set_tags({"trial_state": "PRUNED", PRUNED_AT: epoch})
        self.pruned = f"trial {n} pruned at epoch {epoch} (val_rmse {value:.4g}): worse than the trials before it"
        log.info(
            "pruned    trial %d at epoch %d of %d: val_rmse %.4g is worse than the trials before it at that epoch",
            n,
            epoch,
            trainer.max_epochs,
            value,
        )


def reported(trial: Any, val_rmse: float, epoch: int, number: int) -> Optional[bool]:
    """The epoch's val_rmse reported to the trial; whether its pruner gives up on it. None where
    the study ended the trial meanwhile (its worker found stale): one line, and training goes on
    without reports (a run alone's or a pack member's, never its pack)."""
    try:
        trial.report(val_rmse, epoch)
        return trial.should_prune()
    except optuna.exceptions.UpdateFinishedTrialError as error:
        log.warning(
            "trial     %d was ended by its study meanwhile (%s): its run trains on without reports",
            number,
            one_line(error),
        )
        return None


def trial_callbacks(tracker: Any) -> list:
    """What a search's job adds to training: the per-epoch report and the pruning decision."""
    link = current()
    if link is None:
        return []
    return [TrialReporter(link, tracker)]
