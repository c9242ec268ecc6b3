"""Best, not last: the lowest validation RMSE a run reached and when (step, epoch). A run's last
value depends on where its budget happened to cut it (a learning-rate spike, a noisy epoch);
its best is what a checkpoint-on-best would have kept, and what a comparison can rank by."""

from __future__ import annotations

from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

METRIC = "val_rmse"


class BestValRmse(pl.Callback):
    """Logs best_val_rmse, best_val_rmse_step and best_val_rmse_epoch at each improvement, so the
    run's latest values are its best so far even if it is stopped. Saved in checkpoints: a
    resumed run keeps the best of its first part."""

    def __init__(self, tracker: Optional[Any] = None) -> None:
        self.tracker = tracker
        self.best: Optional[dict[str, float]] = None

    @property
    def value(self) -> Optional[float]:
        return self.best[f"best_{METRIC}"] if self.best else None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(METRIC)
        if value is None:
            return
        value = float(value)  # one read-back per validation, which reads its metrics anyway
        if value != value or (self.best is not None and value >= self.best[f"best_{METRIC}"]):
            return  # NaN, or no better
        self.best = {
            f"best_{METRIC}": value,
            f"best_{METRIC}_step": float(trainer.global_step),
            # counted from 1, as epochs_to_target
            f"best_{METRIC}_epoch": float(trainer.current_epoch + 1),
        }
        if self.tracker is not None:
            self.tracker.log_metrics(self.best, trainer.global_step)
