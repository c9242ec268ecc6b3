"""predict.py's task: a trained network (a training run's MLflow model, or a registered version)
predicts on data from any data group; the predictions are written as CSV and NPZ, and where the
data has targets, RMSE, MAE, R2 and a predicted-vs-actual plot are recorded as an MLflow
evaluation run linked to the training run (tag `training_run_id`, and nested under it).

`predict(cfg)` is plain Python (testable without the CLI); `main` is the Hydra entry's glue."""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import mlflow
import numpy as np
import torch
from hydra.utils import instantiate
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig

from seqlab import SeqlabError, one_line
from seqlab.data.sources import as_sequences
from seqlab.plots import predicted_vs_actual
from seqlab.store.ghosts import end_dead_runs
from seqlab.store.models import run_models
from seqlab.store.server_auth import client_credentials
from seqlab.store.ui import run_link
from seqlab.tracking import ensure_experiment
from seqlab.tracking.connect import client_for
from seqlab.tracking.datasets import base_name, dataset, log_inputs
from seqlab.tracking.model_logging import ARTIFACT_PATH, run_scope
from seqlab.validation import validate_predict

log = logging.getLogger("seqlab")

CHUNK = 1024  # samples per forward pass: a 1440-step LSTM over every sample at once would need GBs


@dataclass
class Predictions:
    model_uri: str
    n_samples: int
    csv: Path
    npz: Path
    training_run_id: Optional[str] = None
    metrics: dict[str, float] = field(default_factory=dict)
    plot: Optional[Path] = None
    run_id: Optional[str] = None  # the evaluation run
    experiment_id: Optional[str] = None


def _redacted(uri: str) -> str:
    return re.sub(r"//[^/@\s]+@", "//***@", uri)


def _model_uri(cfg: DictConfig, client: Any) -> str:
    """The model's URI, after checking that a run=... exists and has a model."""

    if cfg.model_uri is not None:
        return str(cfg.model_uri)
    run_id = str(cfg.run)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise SeqlabError(
            f"run={run_id}: no such run in the store {_redacted(cfg.tracking_uri)}; "
            "train.py prints a run's id (mlflow run ...), and the MLflow UI shows it"
        ) from None
    if next(run_models(client, run, ARTIFACT_PATH), None) is None:
        raise SeqlabError(
            f"run={run_id} ({run.info.status}) has no model: a run logs its network when it finishes; "
            "train again, or give another run"
        )
    return f"runs:/{run_id}/model"


def _load(uri: str) -> Any:

    try:
        return mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as error:
        raise SeqlabError(f"model={uri}: cannot be loaded: {one_line(error)}") from None


def _data(cfg: DictConfig) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Inputs (samples, steps, features), targets (or None), lengths (or None), from the data
    group; an npz file without its y array is predicted on without targets."""

    d = cfg.data
    if d.name == "npz":
        with np.load(d.path) as archive:
            y_key = d.y_key or "y"
            if (d.x_key or "X") in archive.files and y_key not in archive.files:
                x = archive[d.x_key or "X"]
                data = as_sequences(x, np.zeros(len(x), np.float32), d.path)
                return data.x[: d.n_samples] if d.n_samples else data.x, None, None
    datamodule = instantiate(d)
    data = datamodule.source(n_samples=datamodule.n_samples, seed=datamodule.seed)
    if len(data) == 0:
        raise SeqlabError(f"data: {d.name} holds no samples")
    if not np.isfinite(data.x).all():
        first = int(np.argmax(~np.isfinite(data.x).all(axis=(1, 2))))
        raise SeqlabError(
            f"data: inputs hold NaN or Inf (the first in sample {first}); clean the data"
        )
    return data.x, data.y, data.lengths


def _check_shape(model: Any, x: np.ndarray, name: str) -> None:
    signature = model.metadata.signature
    if signature is None or not signature.inputs.is_tensor_spec():
        return
    expected = tuple(signature.inputs.inputs[0].shape[1:])
    if tuple(x.shape[1:]) != expected:
        raise SeqlabError(
            f"data: the model takes inputs of (samples, steps, features) = (N, {expected[0]}, {expected[1]}), "
            f"and {name} has (N, {x.shape[1]}, {x.shape[2]}): predict on data shaped like the training data"
        )


def _training_run(model: Any, client: Any) -> Optional[str]:
    """The run that trained the model: MLflow 3's logged model names it (source_run_id); a model
    logged by MLflow 2 says it in its MLmodel file (run_id)."""
    model_id = getattr(model.metadata, "model_id", None)
    if model_id:
        try:
            return client.get_logged_model(model_id).source_run_id or model.metadata.run_id
        except Exception:  # noqa: BLE001 - a model that is not in this store (a copy, a file)
            pass
    return model.metadata.run_id


def _predict(model: Any, x: np.ndarray, lengths: Optional[np.ndarray]) -> np.ndarray:
    onnx = (
        "onnx" in model.metadata.flavors
    )  # the run's model-onnx: its predictions come as {output name: array}
    if lengths is None:
        chunks = [model.predict(x[i : i + CHUNK]) for i in range(0, len(x), CHUNK)]
        return np.concatenate([next(iter(c.values())) if onnx else c for c in chunks])
    if onnx:
        raise SeqlabError(
            "data: sequences of different lengths: the ONNX model takes sequences of one length; "
            "predict them with the run's PyTorch model (run=<run id>)"
        )

    net = model.get_raw_model()
    with torch.no_grad():
        return np.concatenate(
            [
                net(
                    torch.from_numpy(x[i : i + CHUNK]), torch.from_numpy(lengths[i : i + CHUNK])
                ).numpy()
                for i in range(0, len(x), CHUNK)
            ]
        )


def metrics(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """RMSE and MAE over every value; R2 per response, averaged (as torchmetrics' R2Score)."""
    error = predicted.astype(np.float64) - actual.astype(np.float64)
    centred = actual.astype(np.float64) - actual.mean(axis=0, dtype=np.float64)
    out = {"rmse": float(np.sqrt((error**2).mean())), "mae": float(np.abs(error).mean())}
    if len(actual) > 1:
        out["r2"] = float(np.mean(1.0 - (error**2).sum(axis=0) / (centred**2).sum(axis=0)))
    return out


def _write(out: Path, predicted: np.ndarray, actual: Optional[np.ndarray]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    r = predicted.shape[1]
    names = ["prediction"] if r == 1 else [f"prediction_{j}" for j in range(r)]
    columns = [predicted]
    if actual is not None:
        names += ["target"] if r == 1 else [f"target_{j}" for j in range(r)]
        columns.append(actual)
    csv = out / "predictions.csv"
    np.savetxt(
        csv,
        np.concatenate(columns, axis=1),
        delimiter=",",
        header=",".join(names),
        comments="",
        fmt="%.9g",
    )
    npz = out / "predictions.npz"
    np.savez(npz, predictions=predicted, **({} if actual is None else {"targets": actual}))
    return csv, npz


def predict(cfg: DictConfig, output_dir: Optional[Path] = None) -> Predictions:
    validate_predict(cfg)

    os.environ.setdefault(
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"
    )  # a bar per download: noise here

    out = Path(output_dir or cfg.paths.output_dir)
    store_uri = client_credentials(cfg.tracking_uri)  # a user:password in it is sent, not shown
    client = client_for(store_uri)  # a new local store under its lock; a server checked first
    end_dead_runs(client)  # runs whose process died without closing them, as train and compare do
    with run_scope(store_uri):
        uri = _model_uri(cfg, client)
        model = _load(uri)
    x, y, lengths = _data(cfg)
    _check_shape(model, x, cfg.data.name)
    predicted = _predict(model, x, lengths).reshape(len(x), -1)
    if y is not None and y.shape[1] != predicted.shape[1]:
        raise SeqlabError(
            f"data: {y.shape[1]} target(s) per sample, and the model predicts {predicted.shape[1]}"
        )
    csv, npz = _write(out, predicted, y)
    result = Predictions(uri, len(x), csv, npz, training_run_id=_training_run(model, client))
    log.info("predicted %s samples of %s with %s", f"{len(x):,}", cfg.data.name, uri)
    if y is not None:
        result.metrics = metrics(predicted, y)
        log.info(
            "metrics   rmse %.4g, mae %.4g, r2 %s",
            result.metrics["rmse"],
            result.metrics["mae"],
            f"{result.metrics['r2']:.3f}" if "r2" in result.metrics else "-",
        )
        if cfg.evaluate:
            _record(cfg, client, model, result, x, predicted, y, out)
    log.info(
        "outputs   %s (predictions.csv, predictions.npz%s)",
        out,
        ", predicted_vs_actual.png" if result.plot else "",
    )
    return result


def _record(
    cfg: DictConfig,
    client: Any,
    model: Any,
    result: Predictions,
    x: np.ndarray,
    predicted: np.ndarray,
    actual: np.ndarray,
    out: Path,
) -> None:
    """The evaluation as an MLflow run: metrics (also on the logged model, per dataset), the
    evaluation data as a dataset input, the predictions and the plot."""

    training = client.get_run(result.training_run_id) if result.training_run_id else None
    if training is not None:
        experiment_id, name = training.info.experiment_id, f"predict-{training.info.run_name}"
    else:
        experiment_id, name = ensure_experiment(client, cfg.experiment_name, None), "predict"
    tags = {
        "run_type": "evaluation",
        "model_uri": result.model_uri,
        "data": cfg.data.name,
        "mlflow.source.name": "predict.py",
        "mlflow.source.type": "LOCAL",
    }
    if training is not None:
        tags.update(
            {"training_run_id": training.info.run_id, "mlflow.parentRunId": training.info.run_id}
        )
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    run_id = result.run_id = run.info.run_id
    result.experiment_id = experiment_id
    status = "FAILED"
    try:
        data = dataset(cfg.data, x, actual, base_name(cfg.data))
        log_inputs(client, run_id, [(data, "evaluation")])
        now = int(time.time() * 1000)
        values = {**result.metrics, "n_samples": float(len(x))}
        model_id = getattr(model.metadata, "model_id", None)
        # Linked to the logged model and the dataset: the model's page lists them per dataset.
        client.log_batch(
            run_id,
            metrics=[
                Metric(
                    k,
                    v,
                    now,
                    0,
                    model_id=model_id,
                    dataset_name=data.name,
                    dataset_digest=data.digest,
                )
                for k, v in values.items()
            ],
        )
        client.log_batch(run_id, tags=[RunTag("dataset_digest", data.digest)])
        result.plot = predicted_vs_actual(
            predicted,
            actual,
            out / "predicted_vs_actual.png",
            title=f"{name}: rmse {result.metrics['rmse']:.4g}",
        )
        for path in (result.csv, result.npz, result.plot):
            client.log_artifact(run_id, str(path))
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    linked = f" (linked to training run {training.info.run_id})" if training is not None else ""
    log.info(
        "mlflow    evaluation run %s%s in experiment '%s'",
        run_id,
        linked,
        client.get_experiment(experiment_id).name,
    )
    if cfg.tracking_uri.startswith("sqlite:"):
        log.info("          see it: make ui, then %s", run_link(experiment_id, run_id))


def main(cfg: DictConfig) -> None:
    """Hydra's task function: one line and exit status 1 for what the user can fix."""
    try:
        predict(cfg)
    except SeqlabError as error:
        log.error("error: %s", one_line(error))
        raise SystemExit(1) from None
