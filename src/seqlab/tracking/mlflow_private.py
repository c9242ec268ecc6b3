"""Every use of MLflow's non-public API, in one place. Each is something the public API offers only
through the fluent, process-wide active run, which seqlab does not use (a run is written through
its own client, to its own store, and a sweep's jobs in one process write to different stores):
- a dataset as the entity `MlflowClient.log_inputs` takes (public: `mlflow.log_input`, fluent);
- the system-metrics monitor for a run id (public: `mlflow.start_run(log_system_metrics=True)`, fluent).
An MLflow upgrade can break them, so each call checks first that the installed MLflow is one these
were tested with, and says so in one line if not."""

from __future__ import annotations

import functools
from typing import Any, Optional

from seqlab import require_tested

# The MLflow releases these uses were read against and tested with (pyproject.toml holds mlflow
# below the next major one).
TESTED = ("3.",)


@functools.cache
def check_version() -> None:
    import mlflow

    require_tested("mlflow", mlflow.__version__, TESTED, "MLflow")


def dataset_input(dataset: Any, context: str) -> Any:
    """An MLflow dataset (mlflow.data.from_numpy) as a run input with its context tag
    (training, validation, evaluation), for MlflowClient.log_inputs."""
    check_version()
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return DatasetInput(
        dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]
    )


def system_metrics_monitor(run_id: str, interval_s: float, tracking_uri: Optional[str]) -> Any:
    """MLflow's sampler of CPU, memory and GPU into `run_id` as system/... metrics (not started)."""
    check_version()
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    return SystemMetricsMonitor(run_id, sampling_interval=interval_s, tracking_uri=tracking_uri)
