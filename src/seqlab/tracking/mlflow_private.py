"""Every use of MLflow's non-public API, in one place. Each is something the public API offers only
through the fluent, process-wide active run, which seqlab does not use (a run is written through
its own client, to its own store, and a sweep's jobs in one process write to different stores):
- a dataset as the entity `MlflowClient.log_inputs` takes (public: `mlflow.log_input`, fluent);
- the system-metrics samplers (public: `mlflow.start_run(log_system_metrics=True)`, fluent, a
  thread per run that reads the run back at every sample: tracking/system_metrics.py);
- the module map of MLflow's requirement check, which a model logged with its requirements given
  does not need, and the check's version lookups (no public switch: `given_requirements`);
- the serving check of a logged model's input example, for a model seqlab has checked itself
  (a flavor's `validate_serving_input=False` reaches the ONNX flavor's save_model, which refuses
  it: `serving_checked`), or for a class of network MLflow has checked in this process
  (`serving_checked_once`);
- a logged model's metrics written alone to a SQL store (public: `log_batch` with each metric's
  `model_id`, which writes the run's metric rows again: `link_model_metrics`).
An MLflow upgrade can break them, so each call checks first that the installed MLflow is one these
were tested with, and says so in one line if not."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Iterator

import mlflow
from mlflow.entities import DatasetInput, InputTag, Metric
from mlflow.models import utils as model_utils
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor
from mlflow.utils import requirements_utils
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from seqlab import require_tested

# The MLflow releases these uses were read against and tested with (pyproject.toml holds mlflow
# below the next major one).
TESTED = ("3.",)


@functools.cache
def check_version() -> None:

    require_tested("mlflow", mlflow.__version__, TESTED, "MLflow")


def dataset_input(dataset: Any, context: str) -> Any:
    """An MLflow dataset (mlflow.data.from_numpy) as a run input with its context tag
    (training, validation, evaluation), for MlflowClient.log_inputs."""
    check_version()

    return DatasetInput(
        dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]
    )


def system_samplers() -> list[Any]:
    """MLflow's samplers of CPU and memory, disk, network and a GPU (NVIDIA's, else AMD's, where
    one answers), as its system-metrics monitor builds them; each has collect_metrics,
    aggregate_metrics (name -> value, the names of its system/... metrics) and clear_metrics."""
    check_version()

    samplers = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for gpu in (GPUMonitor, ROCMMonitor):
        try:
            samplers.append(gpu())
            break
        except Exception:  # noqa: BLE001 - no such GPU, or no library to read it (as MLflow decides)
            continue
    return samplers


# MLflow's own lookup of a package's installed version, once a process per package (given_requirements)
_installed_version = functools.cache(requirements_utils._get_installed_version)


@contextmanager
def given_requirements(requirements: list[str]) -> Iterator[None]:
    """A model logged with its pip requirements given (`requirements`: "name==version" or "name"),
    without MLflow first mapping every installed package's files to its modules. MLflow's log_model
    checks the given requirements against the installed versions, and its check builds that map
    once per process (importlib.metadata.packages_distributions: 0.8-1.2 s on the 2-core VM, most
    of the default run's model logging), though it only needs each named package's version, which
    importlib.metadata finds by name. So, for the call only, the map holds just the packages
    named (their modules have their names); one built before is left as it is, and none is left
    behind for MLflow's inference of other models' requirements."""
    check_version()

    # The check then looks each named package's installed version up again for every model (a scan
    # of the installed distributions: about 10 ms a model here); a process's are looked up once.
    looked_up = requirements_utils._get_installed_version
    requirements_utils._get_installed_version = _installed_version
    try:
        if requirements_utils._MODULES_TO_PACKAGES is not None:
            yield
            return
        names = [r.split("==")[0] for r in requirements]
        requirements_utils._MODULES_TO_PACKAGES = {name: [name] for name in names}
        try:
            yield
        finally:
            requirements_utils._MODULES_TO_PACKAGES = None
            requirements_utils._PACKAGES_TO_MODULES = None
    finally:
        requirements_utils._get_installed_version = looked_up


@contextmanager
def serving_checked() -> Iterator[None]:
    """A model logged without MLflow's serving check of its input example (log_model loads the
    files it has just written and predicts the example with them), for a model the caller has
    already predicted with from those very files (tracking.onnx_model.export: onnxruntime on the
    run's training inputs). For the call only."""
    check_version()

    checked = model_utils._validate_serving_input
    model_utils._validate_serving_input = lambda model_uri, serving_input: None
    try:
        yield
    finally:
        model_utils._validate_serving_input = checked


# The kinds of model (network classes) whose logged model passed MLflow's serving check in this
# process (serving_checked_once)
_SERVED: set = set()


@contextmanager
def serving_checked_once(kind: Any) -> Iterator[None]:
    """MLflow's serving check of a logged model's input example (its files loaded back, the example
    predicted) for the first model of `kind` in this process, until one passes it; none for the
    next of that kind. For the call only."""
    if kind in _SERVED:
        with serving_checked():
            yield
        return
    check_version()

    check = model_utils._validate_serving_input

    def checking(model_uri: Any, serving_input: Any) -> Any:
        done = check(model_uri, serving_input)
        _SERVED.add(kind)  # it raises where the model does not load or predict
        return done

    model_utils._validate_serving_input = checking
    try:
        yield
    finally:
        model_utils._validate_serving_input = check


def link_model_metrics(
    client: mlflow.MlflowClient, run_id: str, experiment_id: str, points: list[Metric]
) -> bool:
    """`points` (each with its model_id) as the logged model's metrics in the store of `client`
    where it is a SQL store (this machine's mlflow.db, or a database reached directly): True. The
    public way, `log_batch`, also inserts the run's metric rows again; the store holds them, so its
    insert fails on their key, is rolled back and each row is looked up before the model's rows go
    in (about 16 ms a model on the 2-core VM, two or three models a run). False elsewhere (a
    tracking server, which the caller writes with log_batch)."""
    check_version()

    store = client._tracking_client.store
    if not isinstance(store, SqlAlchemyStore):
        return False
    store._log_model_metrics(run_id, points, experiment_id=experiment_id)
    return True
