"""Where Lightning meets the tracker: the epoch-level metrics the module logs with self.log, at
the optimizer step they belong to."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import pytorch_lightning as pl
from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities import rank_zero_only

from seqlab.tracking.run import MlflowTracker


class StepClock(pl.Callback):
    """The last optimizer step trained. Epoch-level metrics are logged at it, so that they line up
    with the per-step series (the step Lightning hands its loggers lags by one at an epoch's end,
    and counts Lightning calls, not the loop's optimizer steps)."""

    def __init__(self) -> None:
        self.step = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.step = trainer.global_step


class LightningBridge(Logger):
    """Hands what the LightningModule logs with self.log to the tracker, at `clock`'s step.
    Hyperparameters are not taken from Lightning: the tracker logs the whole resolved config."""

    def __init__(self, tracker: MlflowTracker, clock: StepClock) -> None:
        super().__init__()
        self.tracker = tracker
        self.clock = clock

    @property
    def name(self) -> str:
        return self.tracker.experiment_name

    @property
    def version(self) -> str:
        return self.tracker.run_id or ""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        if metrics:
            self.tracker.log_metrics(metrics, self.clock.step)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass
