"""Checkpoints that survive what ends a process: the time-based checkpoint (`checkpoint.interval_s`)
that `resume=RUN_ID` continues from after a kill -9, and writes that never leave a truncated
checkpoint behind (a temporary name, then a rename) and fail in one line naming the path.

A time-based checkpoint is the interrupt checkpoint (seqlab.resume.interrupt) taken on a clock: the same
file name, artifact (`checkpoints/interrupted.ckpt`) and tag (`interrupted_at_step`), so a run
whose process died continues exactly as one stopped by Ctrl-C or SIGTERM does."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl

from seqlab.safe_writes import replace_atomically

log = logging.getLogger("seqlab")


def save_checkpoint(trainer: pl.Trainer, path: Path) -> Path:
    """trainer.save_checkpoint(path), atomically. Every process of a DDP job calls it."""
    # Lightning writes on rank 0 and waits for every process: rank 0 alone renames it too.
    replace_atomically(
        Path(path), lambda tmp: trainer.save_checkpoint(tmp), owner=trainer.is_global_zero
    )
    return Path(path)


def _clock() -> float:
    return time.monotonic()


class TimedCheckpoint(pl.Callback):
    """Every `interval_s` seconds of training, save the interrupt checkpoint at a step boundary
    and hand it to `publish(path, step)`. The clock is read once per Lightning call (not per
    optimizer step); the checkpoint is taken at the start of the next call, the same state a
    SIGTERM stop saves (the previous step and its validation done, nothing of the next one),
    so a resume continues exactly. Single-process training only: under DDP every process would
    have to agree on the moment (there the epoch-based perf.checkpoint_every_n_epochs applies)."""

    def __init__(
        self,
        path: Path,
        interval_s: float,
        publish: Callable[[Path, int], None],
        clock: Optional[Callable[[], float]] = None,
        before_save: Optional[Callable[[], None]] = None,
    ) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.publish = publish
        # The step metrics waiting to be sent (StepMetricsRecorder.flush): a resume continues after
        # the checkpoint and never sends again what the run holds, so what was trained before it
        # must be sent before it is saved, or a kill -9 right after would lose those steps for good.
        self.before_save = before_save
        self.clock = clock or (lambda: _clock())  # looked up at each call: tests give a fake one
        self._last = 0.0
        self._due = False
        self.writes: list[tuple[int, float]] = []  # (step, seconds the save and publish took)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = self.clock()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.clock() - self._last >= self.interval_s:
            self._due = True

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._due:
            return
        self._due = False
        start = time.perf_counter()
        if self.before_save is not None:
            self.before_save()
        save_checkpoint(trainer, self.path)
        self.publish(self.path, trainer.global_step)
        self.writes.append((trainer.global_step, time.perf_counter() - start))
        self._last = self.clock()
