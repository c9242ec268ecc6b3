"""Every metric point a run logged, kept in the training process: the training-curves plot and
the final report read it, without asking the store."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

from mlflow.entities import Metric


class MetricHistory(defaultdict):
    """{name: [(step, value), ...]} in the order logged."""

    def __init__(self) -> None:
        super().__init__(list)

    def add(self, metrics: Iterable[Metric]) -> None:
        for m in metrics:
            self[m.key].append((m.step, m.value))

    def last(self, name: str) -> Optional[float]:
        points = self.get(name)
        return points[-1][1] if points else None
