"""The data a run used, as MLflow dataset inputs: name, source (the file, or the generator and its
settings), digest and shape, with its role (training, validation, evaluation), so that the UI's
Dataset column shows what a run was trained or evaluated on. The digest is MLflow's hash of the
arrays: two runs on the same samples show the same one."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Optional

import mlflow.data
import numpy as np
import pandas as pd
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.digest_utils import MAX_ROWS, compute_numpy_digest, get_normalized_md5_digest
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from seqlab import SeqlabError
from seqlab.delivery.stores import transient
from seqlab.tracking.mlflow_private import dataset_input

log = logging.getLogger("seqlab")


def _source(data_cfg: DictConfig) -> Any:

    if data_cfg.get("path"):
        with warnings.catch_warnings():
            # MLflow registers its local-file source class twice and says so on every path.
            warnings.filterwarnings("ignore", message=r".*can be interpreted in multiple ways")
            return resolve_dataset_source(str(Path(data_cfg.path).resolve()))
    # Generated data: what generated it, with which settings, is its source.
    settings = OmegaConf.to_container(data_cfg.source, resolve=True)
    settings.pop("_partial_", None)
    tags = {"generator": str(settings.pop("_target_", data_cfg.name))}
    tags.update({key: str(value) for key, value in settings.items()})
    tags.update(n_samples=str(data_cfg.n_samples), seed=str(data_cfg.seed))
    return CodeDatasetSource(tags)


def base_name(data_cfg: DictConfig) -> str:
    """A file's name (without its suffix), else the data option's name (synthetic, ...)."""
    return Path(data_cfg.path).stem if data_cfg.get("path") else str(data_cfg.name)


def dataset(
    data_cfg: DictConfig, x: Any, y: Optional[Any], name: str, rows: Optional[np.ndarray] = None
) -> Any:
    """An MLflow NumpyDataset of inputs x (samples, steps, features) and targets y; `rows`: of
    x[rows] and y[rows], with the same digest, shape and schema, without gathering x[rows] (a
    pack member's training set: its start gathered 75 MB a member for it, 3 GB for a pack of 32)."""
    if rows is not None:
        y = y[rows]  # a few values a sample
        # The digest's values: the first MAX_ROWS of the set's flattened inputs, in the rows' order.
        per_row = max(1, math.prod(x.shape[1:]))
        first = x[rows[: math.ceil(MAX_ROWS / per_row)]]
        digest = numpy_digest(first, y, shape=(len(rows), *x.shape[1:]))
        # MLflow reads the inputs' shape and dtype alone where the digest is given (its profile and
        # schema): a read-only view of that shape over one row stands for the set.
        x = np.broadcast_to(first[:1], (len(rows), *x.shape[1:]))
    else:
        digest = numpy_digest(x, y)
    return mlflow.data.from_numpy(x, targets=y, source=_source(data_cfg), name=name, digest=digest)


def numpy_digest(
    x: np.ndarray, y: Optional[np.ndarray], shape: Optional[tuple[int, ...]] = None
) -> str:
    """MLflow's digest of from_numpy's arrays (mlflow.data.digest_utils.compute_numpy_digest: the
    first MAX_ROWS values of each array flattened, and its shape), without its copy of each whole
    array first (array.flatten()): 30-40 ms of every run's two sets of 94 MB here, for a hash of
    the first 10,000 values. `shape`: x's, where x holds only the set's first rows (dataset's
    `rows`). The same digest: tests/unit/tracking/test_datasets.py."""
    arrays = [a for a in (x, y) if a is not None]
    if any(a.dtype == object for a in arrays):
        return compute_numpy_digest(x, y)  # MLflow hashes these otherwise (their size)
    elements: list = []
    for a, a_shape in zip(arrays, (shape or x.shape, None if y is None else y.shape)):
        elements.append(pd.util.hash_array(np.asarray(a.flat[:MAX_ROWS])))
        elements.extend(np.int64(n) for n in a_shape)
    return get_normalized_md5_digest(elements)


def log_inputs(client: Any, run_id: str, inputs: list[tuple[Any, str]]) -> None:
    """Record (dataset, context) pairs as the run's inputs; context: training, validation, evaluation."""

    datasets = [dataset_input(ds, context) for ds, context in inputs]
    try:
        client.log_inputs(run_id, datasets=datasets)
    except MlflowException as error:
        # Jobs of one sweep log the same data at the same moment: MLflow's store looks the dataset
        # up, then inserts it, and the second insert breaks the unique key. Now it is there.
        if "UNIQUE constraint" not in str(error) and "unique constraint" not in str(error).lower():
            raise
        client.log_inputs(run_id, datasets=datasets)


def log_training_data(
    tracker: Any,
    data_cfg: DictConfig,
    datamodule: Any,
    resumed: bool = False,
    data_changed: bool = False,
) -> None:
    """The training and validation sets of a run (after the split) as its dataset inputs. A
    `resumed` run's sets are first checked against those it recorded (check_resumed_data)."""
    with tracker.costs.phase("datasets"):
        _log_sets(tracker, data_cfg, datamodule, resumed, data_changed)


def _log_sets(
    tracker: Any, data_cfg: DictConfig, datamodule: Any, resumed: bool, data_changed: bool
) -> None:
    base = base_name(data_cfg)
    train, rows = datamodule.training_set()
    inputs = [(dataset(data_cfg, train.x, train.y, f"{base}-train", rows), "training")]
    if datamodule.has_val():
        inputs.append(
            (dataset(data_cfg, datamodule.val.x, datamodule.val.y, f"{base}-val"), "validation")
        )
    if resumed:
        check_resumed_data(tracker, data_cfg, inputs, data_changed)
    try:
        log_inputs(tracker.client, tracker.run_id, inputs)
    except Exception as error:  # noqa: BLE001 - a server that went away: training goes on without the record
        if not transient(error):
            raise
        log.warning(
            "data      the dataset inputs were not recorded: the tracking server does not answer (%s)",
            type(error).__name__,
        )


def check_resumed_data(
    tracker: Any, data_cfg: DictConfig, inputs: list[tuple[Any, str]], data_changed: bool
) -> None:
    """A resumed run trains on what it trained on: each set's digest is one the run recorded for
    that role. A data file that grew between the stop and the resume moves samples between the
    split's sets, and the final metrics would be silently optimistic: refused in one line, unless
    resume_data=changed (then the run is tagged resume_data=changed)."""

    recorded: dict[str, list[Any]] = {}
    for given in tracker.client.get_run(tracker.run_id).inputs.dataset_inputs:
        context = next((t.value for t in given.tags if t.key == "mlflow.data.context"), None)
        recorded.setdefault(context, []).append(given.dataset)
    for ds, context in inputs:
        before = recorded.get(context)
        if not before or any(b.digest == ds.digest for b in before):
            continue  # a run that recorded no such set (a server that was away) is not judged
        was = before[-1]
        what = (
            f"the {context} set ({ds.name}) had digest {was.digest} ({_samples(was.profile)} samples), "
            f"{data_cfg.get('path') or 'data=' + str(data_cfg.name)} now gives {ds.digest} ({_samples(ds.profile)} samples)"
        )
        if not data_changed:
            raise SeqlabError(
                f"resume={tracker.run_id}: the data differ from the run's: {what}; train on the data "
                "the run trained on, or go on with these with resume_data=changed"
            )
        log.warning("data      resume_data=changed: %s", what)
        tracker.set_tags({"resume_data": "changed"})


def _samples(profile: Any) -> str:

    try:
        shape = (
            json.loads(profile)["features_shape"]
            if isinstance(profile, str)
            else profile["features_shape"]
        )
        return str(shape[0])
    except (ValueError, KeyError, TypeError, IndexError):
        return "?"
