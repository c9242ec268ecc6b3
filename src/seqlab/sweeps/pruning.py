"""The Lightning side of a search's trials: each member that trains a trial (a job alone's one
member, or a pack's members: seqlab.packing.members) reports each epoch's val_rmse to its trial, and
stops at the end of an epoch its pruner gives up on, while a pack's other members train on."""

from __future__ import annotations

import logging
from typing import Any, Optional

import optuna
import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from seqlab import one_line
from seqlab.sweeps.trial import PRUNED_AT

log = logging.getLogger("seqlab")


class TrialReporter(pl.Callback):
    """Reports val_rmse once an epoch (the last validation of the epoch) under the epoch's number,
    so that trials with different batch sizes are compared at the same point, and stops a member
    at that epoch's end when its pruner says so: its run then ends as any run does (final metrics,
    checkpoint), tagged trial_state=PRUNED with pruned_at_epoch. The members' trials are opened, and
    kept alive, with their runs (seqlab.packing.member_runs)."""

    def __init__(self) -> None:
        self.latest: dict[int, float] = {}  # member -> its latest val_rmse this epoch

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (
            trainer.sanity_checking
            or trainer.state.fn != TrainerFn.FITTING
            or pl_module.val is None
        ):
            return
        for m in pl_module.members:
            if m.trial_link is not None and m.active:
                self.latest[m.k] = pl_module.val["rmse"][m.k]

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook.
        step = pl_module.trained
        latest, self.latest = self.latest, {}
        for m in pl_module.members:
            # Its own epoch: a trial that took a pruned member's slot (hydra.sweeper.refill)
            # reports as its job alone would, from epoch 1.
            epoch = m.own_epoch(trainer.current_epoch + 1)
            value, prune = latest.get(m.k), False
            if m.trial is not None and m.active and value is not None:
                prune = reported(m.trial, value, epoch, m.trial_link.number)
                if prune is None:  # the study ended it meanwhile: it trains on without reports
                    m.trial = None
            if len(pl_module.members) == 1:  # every DDP process stops at the same epoch
                prune = trainer.strategy.broadcast(prune, src=0)
            if not prune:
                continue
            m.stop(step, pl_module.model.member(m.k))
            n = m.trial_link.number if m.trial_link is not None else -1
            m.pruned = (
                f"trial {n} pruned at epoch {epoch} (val_rmse {value:.4g}): worse than the trials "
                "before it"
            )
            if m.trial is not None:
                m.trial.set_user_attr(PRUNED_AT, epoch)
                with m.own_failure("its pruning", step):
                    m.tracker.log_metrics({PRUNED_AT: float(epoch)}, m.own_step(step))
                    m.tracker.set_tags({"trial_state": "PRUNED", PRUNED_AT: epoch})
            log.info(
                "pruned    trial %d%s at epoch %d of %d: val_rmse %.4g is worse than the trials "
                "before it at that epoch%s",
                n,
                f" (member {m.k})" if len(pl_module.members) > 1 else "",
                epoch,
                m.cfg.trainer.max_epochs,  # its own (a pack that refills its slots trains on past it)
                value,
                "; the pack goes on" if any(o.active for o in pl_module.members) else "",
            )
        pl_module.members_stopped(trainer)


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


def trial_callbacks(members: list) -> list:
    """What a search's job adds to training where a member trains a trial: the per-epoch report and
    the pruning decision."""
    return [TrialReporter()] if any(m.trial_link is not None for m in members) else []
