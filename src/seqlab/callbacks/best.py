"""Best, not last: the lowest validation RMSE a run reached and when (step, epoch). A run's last
value depends on where its budget happened to cut it (a learning-rate spike, a noisy epoch);
its best is what a checkpoint-on-best would have kept, and what a comparison can rank by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from seqlab.tracking.records import Best


@dataclass
class BestSoFar:
    """The lowest val_rmse so far (its value, step and epoch) and the validations since it: what each
    member of a job keeps (packing.members.Member.record), offered each validation by the `best`
    callback (callbacks.output_network.OutputNetwork)."""

    patience: Optional[int] = None  # module.validation_patience: None, never out of patience
    best: Optional[Best] = None
    since_best: int = 0

    @property
    def value(self) -> Optional[float]:
        return self.best.value if self.best else None

    def offer(self, value: float, step: int, epoch: int) -> bool:
        """A validation's val_rmse; True where it is a new best (NaN or no lower is not)."""
        if not math.isfinite(value) or (self.best is not None and value >= self.value):
            self.since_best += 1
            return False
        self.best = Best(value, step, epoch)
        self.since_best = 0
        return True

    @property
    def out_of_patience(self) -> bool:
        """MATLAB's ValidationPatience: this many validations in a row without a new best."""
        return self.patience is not None and self.since_best >= self.patience
