"""Which network a run ends with, and when it stops: MATLAB's trainingOptions OutputNetwork
('last-iteration' | 'best-validation-loss': module.output_network last | best) and
ValidationPatience (module.validation_patience: stop once validation has not improved on its
best this many times in a row; null, MATLAB's Inf, never).

Built on best.BestValRmse, which already finds each new lowest val_rmse: this keeps that
network's weights and counts the validations since. For a fixed validation set, the lowest RMSE
is the lowest loss (each is a monotone function of the summed squared error)."""

from __future__ import annotations

import logging
from typing import Any, Optional

import pytorch_lightning as pl

from seqlab import SeqlabError
from seqlab.callbacks.best import METRIC, BestValRmse
from seqlab.tracking.model_logging import Kept, log_new_best

log = logging.getLogger("seqlab")


class OutputNetwork(BestValRmse):
    """best_val_rmse as BestValRmse logs it, plus: with keep='best', a copy of the weights at each
    new best (on the training device: no read-back); with a patience, `trainer.should_stop` once
    that many validations in a row did not improve (MATLAB: 'larger than or equal to the
    previously smallest'). Saved in checkpoints, so a resumed run keeps both."""

    def __init__(
        self,
        tracker: Optional[Any] = None,
        keep: str = "last",
        patience: Optional[int] = None,
        checkpoints: str = "none",
    ) -> None:
        super().__init__(tracker, patience)
        self.keep = keep
        self.patience = patience
        # logger.log_checkpoints: best keeps the best weights to log them at the end (seqlab.train);
        # all also logs the network at each new best as it comes (an MLflow logged model each).
        self.checkpoints = checkpoints
        self.logged: list[
            tuple[str, int]
        ] = []  # (model id, step) of each network logged during training
        self.weights: Optional[dict[str, Any]] = None
        self.stopped: Optional[dict[str, int]] = None  # where patience ran out: step, epoch

    @property
    def state_key(self) -> str:
        # Checkpoints saved before this class existed hold the best under BestValRmse's key.
        return "BestValRmse"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        needs_val = self.keep == "best" or self.patience is not None
        if needs_val and datamodule is not None and not datamodule.has_val():
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

    @property
    def since_best(self) -> int:
        return self.record.since_best

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        new = self.validated(trainer)
        if new is None:
            return
        if new:
            if self.keep == "best" or self.checkpoints in ("best", "all"):
                self.weights = {
                    k: v.detach().clone() for k, v in pl_module.model.state_dict().items()
                }
            if self.checkpoints == "all" and self.tracker is not None and trainer.is_global_zero:
                self._log_checkpoint(trainer, pl_module)
            return
        if self.record.out_of_patience and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped = {"step": trainer.global_step, "epoch": trainer.current_epoch + 1}
            log.info(
                "stopped   early at step %d (epoch %d): val_rmse has not improved on %s for %d validation(s) "
                "(module.validation_patience=%d)",
                trainer.global_step,
                trainer.current_epoch + 1,
                f"{self.value:.4g}",
                self.since_best,
                self.patience,
            )

    def _log_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The network of this new best as a logged model now (its metrics are linked at the end,
        when those of its step are all logged): once per checkpoint, not per step."""
        done = log_new_best(
            self.tracker, pl_module.model, trainer.datamodule.train.x, trainer.global_step
        )
        if done is not None:
            self.logged.append(done)

    def state_dict(self) -> dict[str, Any]:
        weights = None if self.weights is None else {k: v.cpu() for k, v in self.weights.items()}
        return {**super().state_dict(), "weights": weights, "since_best": self.record.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.weights = state.get("weights")
        self.record.since_best = state.get("since_best", 0)

    def restore(self, model: Any, global_step: int) -> Kept:
        """Put the network kept into `model` (the best validation's weights for keep='best'; the
        last ones are there already) and say which."""
        stopped = (
            f"step {self.stopped['step']} (epoch {self.stopped['epoch']})"
            if self.stopped is not None
            else None
        )
        if self.keep == "best" and self.weights is not None:
            model.load_state_dict(self.weights)
            return Kept(
                "best",
                int(self.best[f"best_{METRIC}_step"]),
                int(self.best[f"best_{METRIC}_epoch"]),
                stopped,
            )
        return Kept(
            "last", global_step, stopped_early=stopped
        )  # last, or best when no validation gave a finite value
