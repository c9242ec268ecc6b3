"""MLflow tracking, one job per module:

- `run`:        the run's connection (`MlflowTracker`: open, records, end FINISHED/FAILED/KILLED)
- `lifecycle`:  a run's steps from its opening to its end, a run alone's and a pack member's alike
- `senders`:    how records travel: metrics through the run's journal and the delivery process
                (seqlab.delivery) to any store, or nowhere (a DDP job's other processes)
- `connect`:    reaching a store and its experiment
- `history`:    every point logged, kept for the plot and the report
- `steps`:      per-step metrics without a per-step synchronisation, to each member's run (`StepLog`,
                `StepMetricsRecorder`)
- `divergence`: a NaN/Inf loss stops its member, FAILED (`DivergenceCheck`)
- `describe`:   what a run says about itself: its name, tags, params and config
- `datasets`, `model_logging`, `replayed_steps`: dataset inputs, the logged model, a resumed run's steps stored once
- `mlflow_private`: every use of MLflow's non-public API, behind a version check

The names below (`seqlab.tracking.MlflowTracker`, the configs' `_target_`s) are loaded when first
used: the light modules (a sweep's callback, the store's reaper) import pieces of this package, and a
package that imported MLflow, torch and Lightning on the way would cost them seconds at every start.
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
