"""Best, not last: the lowest validation RMSE a run reached and when (step, epoch). A run's last
value depends on where its budget happened to cut it (a learning-rate spike, a noisy epoch);
its best is what a checkpoint-on-best would have kept, and what a comparison can rank by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

METRIC = "val_rmse"


@dataclass
class BestSoFar:
    """The lowest val_rmse so far (its value, step and epoch) and the validations since it: what a
    run alone's callback (BestValRmse, OutputNetwork) and each pack member (packing.members) keep."""

    patience: Optional[int] = None  # module.validation_patience: None, never out of patience
    best: Optional[dict[str, float]] = None
    since_best: int = 0

    @property
    def value(self) -> Optional[float]:
        return self.best[f"best_{METRIC}"] if self.best else None

    def offer(self, value: float, step: int, epoch: int) -> bool:
        """A validation's val_rmse; True where it is a new best (NaN or no lower is not)."""
        if not math.isfinite(value) or (self.best is not None and value >= self.value):
            self.since_best += 1
            return False
        # the epoch counted from 1, as epochs_to_target
        self.best = {
            f"best_{METRIC}": value,
            f"best_{METRIC}_step": float(step),
            f"best_{METRIC}_epoch": float(epoch),
        }
        self.since_best = 0
        return True

    @property
    def out_of_patience(self) -> bool:
        """MATLAB's ValidationPatience: this many validations in a row without a new best."""
        return self.patience is not None and self.since_best >= self.patience


class BestValRmse(pl.Callback):
    """Logs best_val_rmse, best_val_rmse_step and best_val_rmse_epoch at each improvement, so the
    run's latest values are its best so far even if it is stopped. Saved in checkpoints: a
    resumed run keeps the best of its first part."""

    def __init__(self, tracker: Optional[Any] = None, patience: Optional[int] = None) -> None:
        self.tracker = tracker
        self.record = BestSoFar(patience)

    @property
    def best(self) -> Optional[dict[str, float]]:
        return self.record.best

    @property
    def value(self) -> Optional[float]:
        return self.record.value

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.record.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.record.best = state.get("best")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.validated(trainer)

    def validated(self, trainer: pl.Trainer) -> Optional[bool]:
        """This validation's val_rmse offered to the record (one read-back per validation, which reads
        its metrics anyway); None where there is none (sanity check, no validation metric)."""
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return None
        value = trainer.callback_metrics.get(METRIC)
        if value is None:
            return None
        new = self.record.offer(float(value), trainer.global_step, trainer.current_epoch + 1)
        if new and self.tracker is not None:
            self.tracker.log_metrics(self.record.best, trainer.global_step)
        return new
