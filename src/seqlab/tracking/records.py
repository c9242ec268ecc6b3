"""What a member's run records of its training, as values handed from the callbacks that find them
(seqlab.callbacks) to the member (seqlab.packing.members), its checkpoints and its run's end
(seqlab.packing.member_runs, tracking.lifecycle and model_logging): each epoch's timing, the best
validation, where the target was reached, where it stopped early. Each knows the metric names it
is logged under. A checkpoint keeps them as plain values (dataclasses.asdict), never as classes."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields
from typing import Optional


@dataclass(frozen=True)
class EpochTiming:
    """One finished epoch's training time and rates (EpochTimer), or their medians over epochs
    (`median_of`); the fields are the metrics' names in each training member's run."""

    epoch_time_s: float
    it_per_s: float
    samples_per_s: float

    def metrics(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def median_of(cls, rows: list["EpochTiming"]) -> Optional["EpochTiming"]:
        """Each rate's median over epochs (epoch_median: the first left out when there are others)."""
        if not rows:
            return None
        return cls(*(epoch_median([getattr(r, f.name) for r in rows]) for f in fields(cls)))


@dataclass(frozen=True)
class Reached:
    """Where a member's val_rmse first reached the target: training time, step, epoch (from 1)."""

    time_to_target_s: float
    steps_to_target: int
    epochs_to_target: int

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Best:
    """The lowest val_rmse a member reached, at which step and epoch (from 1, as epochs_to_target)."""

    value: float
    step: int
    epoch: int

    def metrics(self) -> dict[str, float]:
        """As its run records it: best_val_rmse and its step and epoch."""
        return {
            "best_val_rmse": self.value,
            "best_val_rmse_step": float(self.step),
            "best_val_rmse_epoch": float(self.epoch),
        }


@dataclass(frozen=True)
class Stopped:
    """Where a member stopped early (module.validation_patience): its step and epoch (from 1)."""

    step: int
    epoch: int


def epoch_median(values: list[float]) -> Optional[float]:
    """The median of per-epoch values, the first epoch (warm-up, allocator growth) left out when
    there are others: a run alone's (EpochTimer), a pack member's and the benchmark's."""
    values = values[1:] if len(values) > 1 else values
    return statistics.median(values) if values else None
