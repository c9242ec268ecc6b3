"""The best validation score a run reached, and when: `best_val_rmse` (the lowest val_rmse over
the run's validations) and `best_val_rmse_step` (the optimizer step of that validation). The final
network is not always the best one (a learning rate too high for the last epochs), and a search
that ranks trials by their best score needs it recorded on every run."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from seqlab.tracking import MlflowTracker


class BestValRmse(pl.Callback):
    """Logged at each validation that improves on the best so far, so an interrupted or pruned
    run has it too, and the metric's latest value is the best."""

    def __init__(self, tracker: Optional[MlflowTracker] = None) -> None:
        self.tracker = tracker
        self.best: Optional[float] = None
        self.step: Optional[int] = None

    # Saved in checkpoints: a resumed run keeps the best of its first part.
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.step = state.get("best"), state.get("step")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get("val_rmse")
        if value is None:
            return
        value = float(value)
        if math.isfinite(value) and (self.best is None or value < self.best):
            self.best, self.step = value, trainer.global_step
            if self.tracker is not None:
                self.tracker.log_metrics({"best_val_rmse": value, "best_val_rmse_step": float(self.step)}, self.step)
