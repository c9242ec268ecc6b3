"""MLflow tracking, one job per module:

- `run`:        the run's connection (`MlflowTracker`: open, records, end FINISHED/FAILED/KILLED)
- `lifecycle`:  a run's steps from its opening to its end, a run alone's and a pack member's alike
- `senders`:    how records travel: direct (+ the step-writer process), through the outbox to a
                server (+ the fallback copy), or nowhere (a DDP job's other processes)
- `step_writer`, `outbox`: the helper process that writes a local store's metrics; the queue to a server
- `connect`:    reaching a store and its experiment
- `history`:    every point logged, kept for the plot and the report
- `steps`:      per-step metrics without a per-step synchronisation, to each member's run (`StepLog`,
                `StepMetricsRecorder`)
- `divergence`: a NaN/Inf loss stops its member, FAILED (`DivergenceCheck`)
- `describe`:   what a run says about itself: its name, tags, params and config
- `datasets`, `model_logging`, `replayed_steps`: dataset inputs, the logged model, a resumed run's steps stored once
- `mlflow_private`: every use of MLflow's non-public API, behind a version check

The names below (`seqlab.tracking.MlflowTracker`, the configs' `_target_`s) are loaded when first
used: the step writer's helper process imports `seqlab.tracking.step_writer`, and a package that
imported MLflow, torch and Lightning on the way would cost it seconds at every run's start.
"""

import importlib
from typing import Any

_HOMES = {
    "check_server": "connect",
    "ensure_experiment": "connect",
    "Diverged": "divergence",
    "DivergenceCheck": "divergence",
    "MetricHistory": "history",
    "MlflowTracker": "run",
    "flatten": "run",
    "StepLog": "steps",
    "StepMetricsRecorder": "steps",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value  # looked up once
    return value
