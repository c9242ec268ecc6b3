"""Steps a resumed run trains a second time. A checkpoint taken on a clock (checkpoint.interval_s)
lies behind the last step a killed process had logged: `resume=RUN_ID` trains the steps between
the two again. Each metric keeps the values it was first stored with at those steps, so the run's
record holds every step once."""

from __future__ import annotations

from typing import Any, Iterable


def logged_through(client: Any, run_id: str) -> dict[str, int]:
    """The last step each of the run's metrics was logged at."""
    run = client.get_run(run_id)
    through = {}
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        if steps:
            through[key] = max(steps)
    return through


def not_yet_logged(metrics: Iterable[Any], through: dict[str, int]) -> list[Any]:
    """The metric points (with .key and .step) that come after what the run already has."""
    return [m for m in metrics if m.step > through.get(m.key, -1)]
