"""The trained network as an MLflow model: logged once, at the end of a FINISHED run, under the
run's `model` artifact path (`runs:/<id>/model`), with a signature and an input example, so that
`mlflow.pyfunc.load_model` and `mlflow models serve` predict from an array shaped like the
training input (samples, steps, features). `logger.register_as=NAME` also registers it as a new
version of model NAME.

Logging it per epoch would cost more than an epoch of this model: it is logged once."""

from __future__ import annotations

import copy
import logging
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import numpy as np

log = logging.getLogger("seqlab")

ARTIFACT_PATH = "model"
# pickle: the network as its own class (seqlab.model.CNNLSTM), loaded where seqlab is installed.
# MLflow's default, pt2 (torch.export), would add about 3 s to every run here (measured on the
# 2-core VM while it was loaded) for a model that this project's own environment loads anyway.
SERIALIZATION = "pickle"
N_EXAMPLE = 2  # samples in the input example (kept small: it is stored as JSON)


@contextmanager
def run_scope(uri: str, experiment_id: Optional[str] = None) -> Iterator[None]:
    """MLflow's log_model, register_model and evaluation take the store and the experiment from
    process-wide state (the tracking URI, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID; without
    them a logged model lands in experiment 0): the run's own for the call only, then as they
    were (a sweep's jobs in one process may log to different stores)."""
    import os

    import mlflow

    # set_tracking_uri sets MLFLOW_TRACKING_URI too; the variables as they were are put back after
    # it is unset again, so the URI in force is the one before (a URI set before the call is in
    # the variable since set_tracking_uri put it there).
    env = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    mlflow.set_tracking_uri(uri)
    if experiment_id is not None:
        os.environ["MLFLOW_EXPERIMENT_ID"] = str(experiment_id)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # unset: MLflow reads MLFLOW_TRACKING_URI again
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def pip_requirements() -> list[str]:
    """What the model needs, given rather than inferred: MLflow's inference loads the model in a
    subprocess, which costs seconds per run."""
    import mlflow
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}", "numpy"]


def log_network(tracker: Any, network: Any, example_x: np.ndarray, step: int,
                register_as: Optional[str] = None, tags: Optional[dict[str, str]] = None) -> Optional[str]:
    """Log `network` (an nn.Module taking (samples, steps, features)) to the tracker's run as an
    MLflow model; register it as a new version of `register_as` if given. Returns the model's
    URI (models:/NAME/VERSION when registered, else runs:/<id>/model)."""
    import mlflow
    import torch
    from mlflow.models import infer_signature

    from seqlab.tracking.outbox import transient

    # A CPU copy in evaluation mode: what a user's predict() and the server run.
    cpu = copy.deepcopy(network).to("cpu").eval()
    example = np.ascontiguousarray(example_x[:N_EXAMPLE], dtype=np.float32)
    with torch.no_grad():
        out = cpu(torch.from_numpy(example)).numpy()
    signature = infer_signature(example, out)
    tracker.wait_for_metrics()  # the model's metrics are the run's at `step`: stored first
    # MLflow warns on every pickled model that unpickling runs code: here it is this project's
    # own class, saved and loaded by its user; the line would only repeat on every run.
    pytorch_log = logging.getLogger("mlflow.pytorch")
    level = pytorch_log.level
    pytorch_log.setLevel(logging.ERROR)
    try:
        with run_scope(tracker.tracking_uri, tracker.experiment_id):
            info = mlflow.pytorch.log_model(
                cpu,
                name=ARTIFACT_PATH,
                run_id=tracker.run_id,
                signature=signature,
                input_example=example,
                pip_requirements=pip_requirements(),
                registered_model_name=register_as or None,
                step=step,
                tags=tags,
                serialization_format=SERIALIZATION,
            )
    except Exception as error:  # noqa: BLE001 - a server that went away: the run is kept without its model
        if not transient(error):
            raise
        import re

        where = re.sub(r"//[^/@\s]+@", "//***@", tracker.tracking_uri)  # no password an address held
        log.warning("model     not logged: the tracking server at %s does not answer (%s); the checkpoint has "
                    "the weights", where, type(error).__name__)
        return None
    finally:
        pytorch_log.setLevel(level)
    uri = f"runs:/{tracker.run_id}/{ARTIFACT_PATH}"
    if register_as:
        version = info.registered_model_version
        uri = f"models:/{register_as}/{version}"
        tracker.set_tags({"registered_model": uri})
    return uri
