"""What the tests in `integration/test_delivery.py` and `unit/delivery/`
share (under tests/)."""

from __future__ import annotations


def _series(first: int, n: int) -> tuple[dict[str, list[float]], list[int], list[int]]:
    steps = list(range(first, first + n))
    return (
        {"train_loss": [0.5 / s for s in steps], "lr": [1e-3] * n},
        steps,
        [1_000_000 + s for s in steps],
    )
