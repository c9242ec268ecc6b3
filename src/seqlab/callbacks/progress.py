"""A progress line that does not slow training. Lightning's bar reads every logged metric with
.item() on each refresh; this one counts steps on the host and reads the loss back only when it
redraws (at most a few times a second), and otherwise prints one line per epoch: a run alone's
loss and val_rmse, or how many of a pack's members train and the range of their val_rmse."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

import pytorch_lightning as pl

from seqlab.callbacks.timing import EpochTimer


class ProgressLine(pl.Callback):
    """style: perf.progress; only "line" draws (Lightning's bar is the other style). Only the
    process that reports a job (rank 0) draws."""

    def __init__(
        self,
        timer: EpochTimer,
        style: str = "line",
        stream: Optional[TextIO] = None,
        refresh_s: float = 0.5,
    ) -> None:
        self.enabled = style == "line"
        self.timer = timer
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.refresh_s = refresh_s
        self.last_draw = 0.0

    def _write(self, text: str, end: str) -> None:
        self.stream.write(("\r\033[K" if self.live else "") + text + end)
        self.stream.flush()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self.enabled or not trainer.is_global_zero or not self.live:
            return
        now = time.perf_counter()
        if now - self.last_draw < self.refresh_s:
            return
        self.last_draw = now
        elapsed = max(now - (self.timer.start or now), 1e-9)
        self._write(
            f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}  step {trainer.global_step}  "
            f"{self.timer.steps(trainer) / elapsed:,.0f} it/s  {_members(pl_module, 'loss')}",
            end="",
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.enabled or not trainer.is_global_zero:
            return
        row = self.timer.epochs[-1] if self.timer.epochs else None
        parts = [
            f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}",
            f"{row.it_per_s if row else 0:,.0f} it/s",
            f"{row.samples_per_s if row else 0:,.0f} samples/s",
            _members(pl_module, "train_loss"),
        ]
        val = pl_module.val
        if val is not None:
            parts.append(_values("val_rmse", [val["rmse"][m.k] for m in _training(pl_module)]))
        self._write("  ".join(p for p in parts if p), end="\n")


def _training(pl_module: pl.LightningModule) -> list:
    members = pl_module.members
    return [m for m in members if m.active] or members


def _members(pl_module: pl.LightningModule, name: str) -> str:
    """The last step's loss (a run alone's), or how many of a pack's members train."""
    members = pl_module.members
    if len(members) > 1:
        return f"{sum(m.active for m in members)} of {len(members)} members training"
    loss = pl_module.last_loss
    return "" if loss is None else f"{name} {float(loss[0]):.4g}"


def _values(name: str, values: list[float]) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{name} {values[0]:.4g}"
    return f"{name} {min(values):.4g}-{max(values):.4g}"
