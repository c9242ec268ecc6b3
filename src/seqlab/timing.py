"""Honest epoch throughput: the device is synchronised before each clock read, and validation is
left out. The numbers land in MLflow as epoch_time_s, it_per_s and samples_per_s."""

from __future__ import annotations

import time
from typing import Any, Optional

import pytorch_lightning as pl

from seqlab.devices import synchronize
from seqlab.tracking import MlflowTracker


class EpochTimer(pl.Callback):
    def __init__(self, tracker: Optional[MlflowTracker] = None) -> None:
        self.tracker = tracker
        self.start: Optional[float] = None
        self.train_end: Optional[float] = None
        self.batches = 0
        self.samples = 0
        self.epochs: list[dict[str, float]] = []  # one row per finished epoch

    def _now(self, pl_module: pl.LightningModule) -> float:
        synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batches = self.samples = 0
        self.train_end = None
        self.start = self._now(pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        self.samples += len(batch[0])

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.training and self.start is not None and self.train_end is None:
            self.train_end = self._now(pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        end = self.train_end if self.train_end is not None else self._now(pl_module)
        seconds = max(end - self.start, 1e-9)
        row = {
            "epoch_time_s": seconds,
            "it_per_s": self.batches / seconds,
            "samples_per_s": self.samples / seconds,
        }
        self.epochs.append(row)
        if self.tracker is not None:
            self.tracker.log_metrics(row, trainer.global_step)

    def median(self, key: str, skip_first: bool = True) -> Optional[float]:
        """Median over epochs; the first epoch (warm-up, allocator growth) is left out when
        there are others."""
        rows = self.epochs[1:] if skip_first and len(self.epochs) > 1 else self.epochs
        if not rows:
            return None
        values = sorted(r[key] for r in rows)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
