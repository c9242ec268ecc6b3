"""MLflow tracking, one job per module:

- `run`:        the run's lifecycle (`MlflowTracker`: open, records, end FINISHED/FAILED/KILLED)
- `senders`:    how records travel: direct (+ the step-writer process), through the outbox to a
                server (+ the fallback copy), or nowhere (a DDP job's other processes)
- `connect`:    reaching a store and its experiment
- `history`:    every point logged, kept for the plot and the report
- `steps`:      per-step metrics without a per-step synchronisation (`StepLog`, `StepMetricsRecorder`)
- `divergence`: a NaN/Inf loss stops the run (`DivergenceCheck`)
- `lightning`:  the module's self.log metrics into the tracker (`LightningBridge`, `StepClock`)
"""

from seqlab.tracking.connect import check_server, ensure_experiment
from seqlab.tracking.divergence import Diverged, DivergenceCheck
from seqlab.tracking.history import MetricHistory
from seqlab.tracking.lightning import LightningBridge, StepClock
from seqlab.tracking.run import MlflowTracker, flatten
from seqlab.tracking.steps import StepLog, StepMetricsRecorder

__all__ = [
    "Diverged", "DivergenceCheck", "LightningBridge", "MetricHistory", "MlflowTracker", "StepClock",
    "StepLog", "StepMetricsRecorder", "check_server", "ensure_experiment", "flatten",
]
