"""Honest epoch throughput: the device is synchronised before each clock read, and validation is
left out. The numbers land in each training member's run (seqlab.packing.members: a run alone is a
job of one member) as epoch_time_s, it_per_s and samples_per_s, and a pack's networks trained per
second as pack_model_steps_per_s."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from seqlab.tracking.records import EpochTiming, Reached
from seqlab.training.devices import synchronize


class EpochTimer(pl.Callback):
    """Training time per epoch as the sum of its training segments: a segment runs from the
    epoch's start, or from the first batch after a validation, to the next validation or the
    epoch's end. Validation, and the epoch-end work that follows a validation closing the
    epoch, are left out. Each member that trained the epoch (Member.trains_at) gets its row, in
    its run and its `epochs` (its medians at its end); its steps are the job's, so is its time."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock  # seconds; tests pass a fake one
        self.start: Optional[float] = None  # the epoch's start (the progress line's clock too)
        self.segment_start: Optional[float] = None  # None while training is paused
        self.epoch_s = 0.0  # training time of this epoch's finished segments
        self.trained_s = 0.0  # training time of the finished epochs
        self.trained_s_at_val = 0.0  # training time when the latest validation started
        self.first_step = 0
        self.first_sample = 0
        self.epochs: list[EpochTiming] = []  # one row per finished epoch

    def _now(self, pl_module: pl.LightningModule) -> float:
        synchronize(pl_module.device)
        return self.clock()

    def _pause(self, pl_module: pl.LightningModule) -> None:
        if self.segment_start is not None:
            self.epoch_s += self._now(pl_module) - self.segment_start
            self.segment_start = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.first_step = trainer.global_step
        self.first_sample = getattr(pl_module, "samples_trained", 0)
        self.epoch_s = 0.0
        self.start = self.segment_start = self._now(pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.segment_start is None:  # training resumes after a validation
            self.segment_start = self._now(pl_module)

    def steps(self, trainer: pl.Trainer) -> int:
        """Optimizer steps so far this epoch (a fused-loop batch holds many)."""
        return trainer.global_step - self.first_step

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning marks the trainer as validating here, even inside fit.
        if (
            trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and self.start is not None
        ):
            self._pause(pl_module)
            self.trained_s_at_val = self.trained_s + self.epoch_s

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause(pl_module)
        seconds = max(self.epoch_s, 1e-9)
        row = EpochTiming(
            epoch_time_s=seconds,
            it_per_s=self.steps(trainer) / seconds,
            # Every process trains as many samples as this one (DDP shards are equal).
            samples_per_s=(pl_module.samples_trained - self.first_sample)
            * trainer.world_size
            / seconds,
        )
        self.epochs.append(row)
        self.trained_s += seconds
        members = pl_module.members
        logged = row.metrics()
        if (
            len(members) > 1
        ):  # the pack's networks trained per second (the comparison's model-steps/s)
            logged["pack_model_steps_per_s"] = len(members) * row.it_per_s
        for m in members:
            if m.trains_at(pl_module.trained):
                m.epochs.append(row)
                with m.own_failure("its epoch's timing", pl_module.trained):
                    m.tracker.log_metrics(logged, m.own_step(pl_module.trained))

    # Saved in checkpoints, so that a resumed run's training time continues (plain values: a
    # checkpoint holds nothing that must be unpickled as a class of this project).
    def state_dict(self) -> dict[str, Any]:
        return {"trained_s": self.trained_s, "epochs": [r.metrics() for r in self.epochs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trained_s = state.get("trained_s", 0.0)
        self.epochs = [EpochTiming(**r) for r in state.get("epochs", [])]


class TimeToTarget(pl.Callback):
    """Time to quality (as MLPerf reports time-to-train): the training time, from the timer's
    synchronised clock with validation left out, at which a member's val_rmse first reached the
    target; also the step and epoch (Member.reached, logged to its run). Runs that never reach it
    are tagged target_reached=false at their end (seqlab.packing.member_runs). A target of None:
    nothing is tracked."""

    def __init__(self, timer: EpochTimer, target_rmse: Optional[float]) -> None:
        self.timer = timer
        self.target = target_rmse

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (
            self.target is None
            or trainer.sanity_checking
            or trainer.state.fn != TrainerFn.FITTING
            or pl_module.val is None
        ):
            return
        step, epoch = pl_module.trained, trainer.current_epoch + 1
        for m in pl_module.members:
            if not m.active or m.reached is not None:
                continue
            m.reached = reached(
                self.target,
                pl_module.val["rmse"][m.k],
                self.timer.trained_s_at_val - m.start_s,
                m.own_step(step),
                m.own_epoch(epoch),
            )
            if m.reached is not None:
                with m.own_failure("its time to target", step):
                    m.tracker.log_metrics(m.reached.metrics(), m.own_step(step))


def reached(
    target: Optional[float], val_rmse: float, trained_s: float, step: int, epoch: int
) -> Optional[Reached]:
    """Time, step and epoch to the target where this validation reached it (a run alone's, a pack member's)."""
    if target is None or not val_rmse <= target:
        return None
    return Reached(trained_s, step, epoch)


def target_tags(target: float, reached: Optional[Reached]) -> dict[str, Any]:
    """A run's tags at its end, where it had a target."""
    return {"target_rmse": target, "target_reached": str(reached is not None).lower()}
