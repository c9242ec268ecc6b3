"""Which network a run ends with, and when it stops: MATLAB's trainingOptions OutputNetwork
('last-iteration' | 'best-validation-loss': module.output_network last | best) and
ValidationPatience (module.validation_patience: stop once validation has not improved on its
best this many times in a row; null, MATLAB's Inf, never).

Member by member (a run alone is a job of one member; seqlab.packing.members): each validation's
val_rmse is offered to each training member's record (callbacks.best.BestSoFar), a new best is
logged to its run (best_val_rmse and its step and epoch, so that a run's latest values are its
best so far even if it is stopped) and, to keep it, its weights are copied on the training device
(no read-back); a member out of patience stops there while the others train on, and the job stops
once none trains. For a fixed validation set, the lowest RMSE is the lowest loss (each is a
monotone function of the summed squared error). What it keeps is in the member, saved with every
checkpoint, so a resumed run keeps it."""

from __future__ import annotations

import copy
import logging
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from seqlab import SeqlabError
from seqlab.tracking.model_logging import log_new_best
from seqlab.tracking.records import Stopped

log = logging.getLogger("seqlab")


def validated(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Optional[dict[str, list]]:
    """The validation that just ran, per member (SeqRegressor.val); None for a sanity check or a
    validation outside fit."""
    if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
        return None
    return pl_module.val


class OutputNetwork(pl.Callback):
    """keep='best': each member's weights at its new bests, to end with; `patience`: a member stops
    once that many validations in a row did not improve (MATLAB: 'larger than or equal to the
    previously smallest'); `checkpoints` (logger.log_checkpoints): best keeps the best weights to
    log them at the end (seqlab.tracking.model_logging), all also logs the network at each new best
    as it comes (an MLflow logged model each)."""

    def __init__(
        self, keep: str = "last", patience: Optional[int] = None, checkpoints: str = "none"
    ) -> None:
        self.keep = keep
        self.patience = patience
        self.checkpoints = checkpoints

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        needs_val = self.keep == "best" or self.patience is not None
        if needs_val and pl_module.data.val_rows is None:
            asked = " and ".join(
                ([f"module.output_network={self.keep}"] if self.keep == "best" else [])
                + (
                    [f"module.validation_patience={self.patience}"]
                    if self.patience is not None
                    else []
                )
            )
            raise SeqlabError(
                f"{asked} needs validation data, and this run has none: set data.val_fraction above 0 "
                "(or give the data its own validation set)"
            )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        val = validated(trainer, pl_module)
        if val is None:
            return
        step, epoch = pl_module.trained, trainer.current_epoch + 1
        for m in pl_module.members:
            if not m.active:
                continue
            m.record.patience = self.patience
            # The step and epoch as the member's run counts them (a refilled slot's starts later).
            own_step, own_epoch = m.own_step(step), m.own_epoch(epoch)
            with m.own_failure("its best", step):
                if m.record.offer(val["rmse"][m.k], own_step, own_epoch):
                    m.tracker.log_metrics(m.record.best.metrics(), own_step)
                    if self.keep == "best" or self.checkpoints in ("best", "all"):
                        m.best_weights = pl_module.model.member(m.k)
                    if self.checkpoints == "all" and trainer.is_global_zero:
                        self._log_checkpoint(m, own_step)
                elif m.record.out_of_patience:
                    m.stop(step, pl_module.model.member(m.k))
                    m.stopped = Stopped(own_step, own_epoch)
                    others = any(o.active for o in pl_module.members)
                    log.info(
                        "stopped   %searly at step %d (epoch %d): val_rmse has not improved on %s "
                        "for %d validation(s) (module.validation_patience=%d)%s",
                        f"member {m.k} " if len(pl_module.members) > 1 else "",
                        own_step,
                        own_epoch,
                        "-" if m.record.value is None else f"{m.record.value:.4g}",
                        m.record.since_best,
                        self.patience,
                        "; the pack goes on" if others else "",
                    )
        pl_module.members_stopped(trainer)

    @staticmethod
    def _log_checkpoint(m: Any, step: int) -> None:
        """The network of this new best as a logged model now (its metrics are linked at the end,
        when those of its step are all logged): once per new best, not per step."""
        network = copy.deepcopy(m.network)
        network.load_state_dict(m.best_weights)
        done = log_new_best(m.tracker, network, m.datamodule.example_x, step)
        if done is not None:
            m.logged.append(done)
