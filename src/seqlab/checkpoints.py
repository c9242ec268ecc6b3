"""Checkpoints that survive what ends a process: the time-based checkpoint (`checkpoint.interval_s`)
that `resume=RUN_ID` continues from after a kill -9, and writes that never leave a truncated
checkpoint behind (a temporary name, then a rename) and fail in one line naming the path.

A time-based checkpoint is the interrupt checkpoint (seqlab.interrupt) taken on a clock: the same
file name, artifact (`checkpoints/interrupted.ckpt`) and tag (`interrupted_at_step`), so a run
whose process died continues exactly as one stopped by Ctrl-C or SIGTERM does."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl

from seqlab.safe_writes import replace_atomically

log = logging.getLogger("seqlab")


def save_checkpoint(trainer: pl.Trainer, path: Path) -> Path:
    """trainer.save_checkpoint(path), atomically. Every process of a DDP job calls it."""
    # Lightning writes on rank 0 and waits for every process: rank 0 alone renames it too.
    replace_atomically(Path(path), lambda tmp: trainer.save_checkpoint(tmp), owner=trainer.is_global_zero)
    return Path(path)


def store_checkpoint(tracker: Any, path: Path, artifact_path: str = "checkpoints") -> None:
    """The run's copy of a checkpoint file. Into a local artifact folder it is copied under a
    temporary name and renamed (MLflow copies in place: a kill mid-copy would leave a truncated
    file that a resume downloads); elsewhere MLflow uploads it (a server stores an upload only
    once it has all of it)."""
    if tracker.run_id:
        folder = tracker.local_artifact_dir()
        if folder is not None:
            replace_atomically(folder / artifact_path / path.name, lambda tmp: shutil.copyfile(path, tmp))
            return
    tracker.log_artifact(path, artifact_path)


def publish_resume_point(tracker: Any, path: Path, step: int) -> None:
    """Make `path` the checkpoint `resume=RUN_ID` continues from: the artifact first, then the tag
    that says it is there (a kill between the two leaves the previous one in force)."""
    from seqlab.interrupt import STOPPED_AT

    store_checkpoint(tracker, path)
    tracker.set_tags({STOPPED_AT: step})


def drop_resume_point(tracker: Any) -> None:
    """Training went to its end: no checkpoint is left to continue from (a finished run is not resumed)."""
    from mlflow.exceptions import MlflowException

    from seqlab.interrupt import STOPPED_AT

    if tracker.client is None or not tracker.run_id:
        return
    try:
        tracker.client.delete_tag(tracker.run_id, STOPPED_AT)
    except MlflowException:
        pass  # it had none


def _clock() -> float:
    return time.monotonic()


class TimedCheckpoint(pl.Callback):
    """Every `interval_s` seconds of training, save the interrupt checkpoint at a step boundary
    and hand it to `publish(path, step)`. The clock is read once per Lightning call (not per
    optimizer step); the checkpoint is taken at the start of the next call, the same state a
    SIGTERM stop saves (the previous step and its validation done, nothing of the next one),
    so a resume continues exactly. Single-process training only: under DDP every process would
    have to agree on the moment (there the epoch-based perf.checkpoint_every_n_epochs applies)."""

    def __init__(self, path: Path, interval_s: float, publish: Callable[[Path, int], None],
                 clock: Optional[Callable[[], float]] = None) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.publish = publish
        self.clock = clock or (lambda: _clock())  # looked up at each call: tests give a fake one
        self._last = 0.0
        self._due = False
        self.writes: list[tuple[int, float]] = []  # (step, seconds the save and publish took)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = self.clock()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.clock() - self._last >= self.interval_s:
            self._due = True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self._due:
            return
        self._due = False
        start = time.perf_counter()
        save_checkpoint(trainer, self.path)
        self.publish(self.path, trainer.global_step)
        self.writes.append((trainer.global_step, time.perf_counter() - start))
        self._last = self.clock()
