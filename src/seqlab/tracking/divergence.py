"""A loss that became NaN or Inf ends the run at once, with the step it happened at."""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl

from seqlab import SeqlabError
from seqlab.tracking.history import MetricHistory


class Diverged(SeqlabError):
    """The loss became NaN or Inf."""


class DivergenceCheck(pl.Callback):
    """Looks at the train_loss values the step recorder has read back (it reads them anyway, so
    this costs no synchronisation): a divergence stops the run within one send interval
    (logger.flush_every_n_steps, flush_every_s). Placed after the recorder in the callbacks."""

    def __init__(self, tracker: Any) -> None:
        self.history: MetricHistory = tracker.history
        self.seen = 0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.check()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check()

    def check(self) -> None:
        points = self.history.get("train_loss", [])
        new, self.seen = points[self.seen :], len(points)
        for step, value in new:
            if not math.isfinite(value):
                raise Diverged(
                    f"the training loss became {value} at step {step}: training diverged; "
                    "lower optimizer.lr, set module.gradient_threshold, or check the data"
                )
