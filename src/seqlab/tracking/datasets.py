"""The data a run used, as MLflow dataset inputs: name, source (the file, or the generator and its
settings), digest and shape, with its role (training, validation, evaluation), so that the UI's
Dataset column shows what a run was trained or evaluated on. The digest is MLflow's hash of the
arrays: two runs on the same samples show the same one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from seqlab.tracking.mlflow_private import dataset_input

log = logging.getLogger("seqlab")


def _source(data_cfg: DictConfig) -> Any:
    import warnings

    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source

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


def dataset(data_cfg: DictConfig, x: Any, y: Optional[Any], name: str) -> Any:
    """An MLflow NumpyDataset of inputs x (samples, steps, features) and targets y."""
    import mlflow.data

    return mlflow.data.from_numpy(x, targets=y, source=_source(data_cfg), name=name)


def log_inputs(client: Any, run_id: str, inputs: list[tuple[Any, str]]) -> None:
    """Record (dataset, context) pairs as the run's inputs; context: training, validation, evaluation."""
    from mlflow.exceptions import MlflowException

    datasets = [dataset_input(ds, context) for ds, context in inputs]
    try:
        client.log_inputs(run_id, datasets=datasets)
    except MlflowException as error:
        # Jobs of one sweep log the same data at the same moment: MLflow's store looks the dataset
        # up, then inserts it, and the second insert breaks the unique key. Now it is there.
        if "UNIQUE constraint" not in str(error) and "unique constraint" not in str(error).lower():
            raise
        client.log_inputs(run_id, datasets=datasets)


def log_training_data(tracker: Any, data_cfg: DictConfig, datamodule: Any) -> None:
    """The training and validation sets of a run (after the split) as its dataset inputs."""
    from seqlab.tracking.outbox import transient

    base = base_name(data_cfg)
    inputs = [(dataset(data_cfg, datamodule.train.x, datamodule.train.y, f"{base}-train"), "training")]
    if datamodule.has_val():
        inputs.append((dataset(data_cfg, datamodule.val.x, datamodule.val.y, f"{base}-val"), "validation"))
    try:
        log_inputs(tracker.client, tracker.run_id, inputs)
    except Exception as error:  # noqa: BLE001 - a server that went away: training goes on without the record
        if not transient(error):
            raise
        log.warning("data      the dataset inputs were not recorded: the tracking server does not answer (%s)",
                    type(error).__name__)
