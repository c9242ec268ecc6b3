"""The trained network as an MLflow model: logged once, at the end of a FINISHED run, under the
run's `model` artifact path (`runs:/<id>/model`), with a signature and an input example, so that
`mlflow.pyfunc.load_model` and `mlflow models serve` predict from an array shaped like the
training input (samples, steps, features). `logger.register_as=NAME` also registers it as a new
version of model NAME.

Logging it per epoch would cost more than an epoch of this model: it is logged once."""

from __future__ import annotations

import copy
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import mlflow
import numpy as np
import torch
from mlflow.entities import LoggedModelOutput, Metric
from mlflow.models import infer_signature

from seqlab import one_line
from seqlab.delivery.stores import transient
from seqlab.tracking.mlflow_private import (
    given_requirements,
    link_model_metrics,
    serving_checked,
    serving_checked_once,
)
from seqlab.tracking.onnx_model import OPSET, TOLERANCE, export
from seqlab.tracking.records import Best

log = logging.getLogger("seqlab")

ARTIFACT_PATH = "model"
# pickle: the network as its own class (seqlab.model.CNNLSTM), loaded where seqlab is installed.
# MLflow's default, pt2 (torch.export), would add about 3 s to every run here (measured on the
# 2-core VM while it was loaded) for a model that this project's own environment loads anyway.
SERIALIZATION = "pickle"
N_EXAMPLE = 2  # samples in the input example (kept small: it is stored as JSON)
BEST = "checkpoint-best"  # the lowest val_rmse's network, where it is not the one kept
CHECKPOINT = "checkpoint"  # logger.log_checkpoints=all: the network at each new best val_rmse
ONNX = "model-onnx"  # logger.log_onnx: the network kept, as ONNX (tracking/onnx_model.py)


@dataclass
class Kept:
    """Which network a run ends with (module.output_network), as a run alone's OutputNetwork.restore
    and a pack member's Member.kept decide it: the run's tags say it, the job's result names it."""

    output_network: str  # last | best
    step: int  # the step of its weights
    epoch: Optional[int] = None  # the best validation's epoch (best only)
    stopped_early: Optional[str] = (
        None  # "step N (epoch E)", where validation patience stopped training
    )

    def tags(self) -> dict[str, str]:
        tags = {"output_network": self.output_network, "output_network_step": str(self.step)}
        if self.epoch is not None:
            tags["output_network_epoch"] = str(self.epoch)
        if self.stopped_early is not None:
            tags["stopped_early"] = self.stopped_early
        return tags

    @property
    def name(self) -> str:
        """'last', or 'best (step N)': the job result's output_network."""
        return f"best (step {self.step})" if self.output_network == "best" else self.output_network


@dataclass
class LoggedNetwork:
    uri: str  # runs:/<run id>/<name>, or models:/NAME/VERSION when registered
    model_id: str  # MLflow 3's own: models:/<model_id> loads it too


@contextmanager
def run_scope(uri: str, experiment_id: Optional[str] = None) -> Iterator[None]:
    """MLflow's log_model, register_model and evaluation take the store and the experiment from
    process-wide state (the tracking URI, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID; without
    them a logged model lands in experiment 0): the run's own for the call only, then as they
    were (a sweep's jobs in one process may log to different stores)."""

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

    return [f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}", "numpy"]


def _logged_model(tracker: Any, name: str, tags: Optional[dict[str, str]]) -> str:
    """A new logged model of the run, made here rather than by log_model(run_id=...): MLflow 3.17's
    log_model then links the run's metrics at the model's step by reading every metric's whole
    history back from the store (for a run's per-step train_loss, thousands of rows per model)."""

    model = mlflow.MlflowClient(tracker.tracking_uri).create_logged_model(
        tracker.experiment_id, name=name, source_run_id=tracker.run_id, tags=tags, model_type=None
    )
    return model.model_id


def link_metrics(tracker: Any, model_id: str, step: int) -> None:
    """The model as an output of its run at `step`, with the epoch-level metrics (validation, best_*)
    this process logged at that step, as log_model(run_id=..., step=...) would link them: the run's
    Models tab ranks its models by them."""

    client = mlflow.MlflowClient(tracker.tracking_uri)
    client.log_outputs(tracker.run_id, [LoggedModelOutput(model_id, step=step)])
    points = [
        Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id)
        for m in tracker.points
        if m.step == step
    ]
    if not points or link_model_metrics(client, tracker.run_id, tracker.experiment_id, points):
        return
    # A server: the same rows, now with the model's id. MLflow's store skips a row it holds, but two
    # writers inserting one row at once (the delivery process still sending it) break its unique
    # key (seen: IntegrityError on metrics, a resumed run's end under load). So the run's own
    # sending of them is waited for first, however slow the store.
    tracker.sync_metrics(tracker.outage_wait_s, idle=True)
    client.log_batch(tracker.run_id, metrics=points)


def log_network(
    tracker: Any,
    network: Any,
    example_x: np.ndarray,
    step: int,
    register_as: Optional[str] = None,
    tags: Optional[dict[str, str]] = None,
    name: str = ARTIFACT_PATH,
    link: bool = True,
) -> Optional[LoggedNetwork]:
    """Log `network` (an nn.Module taking (samples, steps, features)) to the tracker's run as an
    MLflow model named `name` at `step`; register it as a new version of `register_as` if given.
    link: wait for the run's metrics and link those of `step` now (a network logged mid-training
    does not wait; its metrics are linked at the end with link_metrics). None: the server was away."""

    # A CPU copy in evaluation mode: what a user's predict() and the server run.
    cpu = copy.deepcopy(network).to("cpu").eval()
    example = np.ascontiguousarray(example_x[:N_EXAMPLE], dtype=np.float32)
    with torch.no_grad():
        out = cpu(torch.from_numpy(example)).numpy()
    signature = infer_signature(example, out)
    if link:
        tracker.wait_for_metrics()  # the model's metrics are the run's at `step`: stored first
    # MLflow warns on every pickled model that unpickling runs code: here it is this project's
    # own class, saved and loaded by its user; the line would only repeat on every run.
    pytorch_log = logging.getLogger("mlflow.pytorch")
    level = pytorch_log.level
    pytorch_log.setLevel(logging.ERROR)
    try:
        requirements = pip_requirements()
        with (
            run_scope(tracker.tracking_uri, tracker.experiment_id),
            given_requirements(requirements),
            # MLflow loads each logged model's files back and predicts its input example (about 45
            # ms a model here): a check that the pickled class loads and serves, the same for
            # every network of one class, whose prediction of the example is the signature's
            # above. Once a process (a pack's members, a study's jobs).
            serving_checked_once(type(cpu)),
        ):
            model_id = _logged_model(tracker, name, tags)
            info = mlflow.pytorch.log_model(
                cpu,
                name=name,
                model_id=model_id,
                signature=signature,
                input_example=example,
                pip_requirements=requirements,
                registered_model_name=register_as or None,
                serialization_format=SERIALIZATION,
            )
            if link:
                link_metrics(tracker, model_id, step)
    except Exception as error:  # noqa: BLE001 - a server that went away: the run is kept without its model
        if not transient(error):
            raise

        where = re.sub(
            r"//[^/@\s]+@", "//***@", tracker.tracking_uri
        )  # no password an address held
        log.warning(
            "model     not logged: the tracking server at %s does not answer (%s); the checkpoint has "
            "the weights",
            where,
            type(error).__name__,
        )
        return None
    finally:
        pytorch_log.setLevel(level)
    uri = f"runs:/{tracker.run_id}/{name}"
    if register_as:
        version = info.registered_model_version
        uri = f"models:/{register_as}/{version}"
        tracker.set_tags({"registered_model": uri})
    return LoggedNetwork(uri, model_id)


def _kept_is_best(found: Optional[Best], kept: Kept) -> bool:
    """Whether the network kept (`model`) is the best validation's (`found`: best_val_rmse and its
    step): kept as best, or the last network and the best at the same step."""
    if kept.output_network == "best":
        return True
    return found is not None and found.step == kept.step


def _log_checkpoints(
    tracker: Any,
    found: Optional[Best],
    weights: Optional[dict[str, Any]],
    logged: list[tuple[str, int]],
    network: Any,
    example_x: np.ndarray,
    kept: Kept,
) -> None:
    """At a run's end, per logger.log_checkpoints: the best validation's network (`weights`, found
    at `found`'s step) as a logged model `checkpoint-best` unless it is the network kept (`model`,
    tagged checkpoint=best by the caller), and the metrics of each network logged during training
    (`logged`: model id and step, with all) linked to it."""

    if tracker.log_checkpoints == "none":
        return
    try:
        for model_id, step in logged:
            link_metrics(tracker, model_id, step)
    except Exception as error:  # noqa: BLE001 - a server that went away: the models stay, unlinked
        if not transient(error):
            raise
        log.warning(
            "model     the checkpoints' metrics not linked: the tracking server does not answer (%s)",
            type(error).__name__,
        )
        return
    if found is None or weights is None or _kept_is_best(found, kept):
        return
    best = copy.deepcopy(network)
    best.load_state_dict(weights)
    step, value = found.step, found.value
    done = log_network(
        tracker,
        best,
        example_x,
        step,
        name=BEST,
        tags={"checkpoint": "best", "best_val_rmse": f"{value:.6g}", "step": str(step)},
    )
    if done is not None:
        log.info(
            "model     best val_rmse %.4g (step %d) also logged: models:/%s",
            value,
            step,
            done.model_id,
        )


def log_new_best(
    tracker: Any, network: Any, example_x: np.ndarray, step: int
) -> Optional[tuple[str, int]]:
    """logger.log_checkpoints=all: the network of a new best val_rmse as a logged model now, once per
    checkpoint, not per step; (its model id, step) for log_networks to link its metrics at the end,
    when those of its step are all logged. A run alone (callbacks.output_network) and a pack's member."""
    done = log_network(
        tracker,
        network,
        example_x,
        step,
        name=CHECKPOINT,
        tags={"checkpoint": "new best val_rmse"},
        link=False,
    )
    return None if done is None else (done.model_id, step)


def log_networks(
    tracker: Any,
    network: Any,
    example_x: np.ndarray,
    kept: Kept,
    found: Optional[Best],
    weights: Optional[dict[str, Any]],
    logged: list[tuple[str, int]],
) -> Optional[LoggedNetwork]:
    """A run's networks at its end: the one kept as `model`, at its weights' step (the best
    validation's with module.output_network=best, else the last) and tagged checkpoint=best when
    it is the best validation's network; then, per logger.log_checkpoints, `checkpoint-best` and
    the links of those logged during training. A run alone and a pack's member alike."""
    is_best = tracker.log_checkpoints != "none" and _kept_is_best(found, kept)
    tags = {**kept.tags(), **({"checkpoint": "best"} if is_best else {})}
    done = log_network(tracker, network, example_x, kept.step, tracker.register_as, tags=tags)
    if (
        done is not None and tracker.log_onnx
    ):  # a copy of `model`: not itself the run's checkpoint=best
        log_onnx(tracker, network, example_x, kept.step, {**kept.tags(), "onnx_of": done.model_id})
    _log_checkpoints(tracker, found, weights, logged, network, example_x, kept)
    return done


def log_onnx(
    tracker: Any, network: Any, inputs: np.ndarray, step: int, tags: dict[str, str]
) -> Optional[str]:
    """logger.log_onnx: the network kept, also as the ONNX model `model-onnx` at `step` (MLflow's
    onnx flavor: mlflow.pyfunc and `mlflow models serve` predict with onnxruntime), checked first
    against the network on the training inputs (tracking.onnx_model.export). Its URI; None, with one
    line, where the network cannot be exported or its export predicts otherwise: the run keeps its
    PyTorch model and ends as it trained."""
    import onnx  # onnx and onnxruntime: a run that exports only (tracking/onnx_model.py)
    import onnxruntime  # as onnx

    try:
        exported = export(network, inputs)
        if not exported.max_difference <= TOLERANCE:
            raise ValueError(
                f"onnxruntime's predictions differ from the network's by up to "
                f"{exported.max_difference:.3g} (at most {TOLERANCE:g})"
            )
        example = np.ascontiguousarray(inputs[:N_EXAMPLE], dtype=np.float32)
        requirements = [
            f"onnx=={onnx.__version__}",
            f"onnxruntime=={onnxruntime.__version__}",
            f"mlflow=={mlflow.__version__}",
            "numpy",
        ]
        with (
            run_scope(tracker.tracking_uri, tracker.experiment_id),
            given_requirements(requirements),
            # MLflow would load the file into onnxruntime again to predict the two-sample example:
            # export() has predicted N_CHECK training inputs with it, against the network (about
            # 17 ms of every run's end here).
            serving_checked(),
        ):
            model_id = _logged_model(
                tracker,
                ONNX,
                {**tags, "onnx_opset": str(OPSET), "onnx_operators": " ".join(exported.operators)},
            )
            mlflow.onnx.log_model(
                exported.model,
                name=ONNX,
                model_id=model_id,
                input_example=example,
                signature=infer_signature(example, exported.example_output),
                # onnxruntime's CPU provider alone: MLflow's default lists CUDA first and
                # warns at every load without it; a network this small predicts on the CPU.
                onnx_execution_providers=["CPUExecutionProvider"],
                save_as_external_data=False,
                pip_requirements=requirements,
            )
            link_metrics(tracker, model_id, step)
    except Exception as error:  # noqa: BLE001 - the run keeps its PyTorch model: ONNX is a copy of it
        log.warning(
            "model     not logged as ONNX: %s (logger.log_onnx=false leaves it out)",
            one_line(error),
        )
        return None
    log.info(
        "model     also as ONNX (opset %d, %s bytes, largest difference %.2g): runs:/%s/%s",
        OPSET,
        f"{exported.size_bytes:,}",
        exported.max_difference,
        tracker.run_id,
        ONNX,
    )
    return f"runs:/{tracker.run_id}/{ONNX}"
