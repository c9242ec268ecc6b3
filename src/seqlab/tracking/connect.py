"""Reaching a store: a server that answers (or one line saying it does not), the client settings a
server needs, and the experiment, created once even when jobs race for it."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

import mlflow
import requests
from hydra.utils import instantiate
from mlflow.exceptions import MlflowException

from seqlab import SeqlabError
from seqlab.store.local import open_client, store_folder
from seqlab.store.server import wait_until_up
from seqlab.store.server_auth import check_credentials
from seqlab.store.ui import EXPERIMENT_KIND_TAG, MODEL_TRAINING


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def client_for(uri: str) -> mlflow.MlflowClient:
    """A client for `uri`: a server is checked first (MLflow's own client retries for minutes
    before it gives up); a local store's folder is created, and a new store is created by one
    process at a time (seqlab.store.local)."""
    if is_server(uri):
        check_server(uri)
        # The delivery process retries on its own schedule; MLflow's default (7 retries with a doubling
        # back-off, 120 s timeouts) would hold each write for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        # MLflow prints its own run links (without the UI's model-training view) as each run
        # ends; the report prints one that opens the runs (seqlab.store.ui).
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # While a server is away, the delivery process says so once; urllib3 would warn per retry.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    if uri.startswith("sqlite:///"):
        store_folder(Path(uri[len("sqlite:///") :]))

    return open_client(uri)


def check_server(uri: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds, with one line, when no MLflow server answers at `uri`."""

    try:
        response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException as error:
        raise SeqlabError(
            f"logger.tracking_uri={uri}: no MLflow server answers there ({type(error).__name__}); "
            "start it (mlflow server ...) or drop logger.tracking_uri to use the local store"
        ) from None
    if response.status_code != 200:
        raise SeqlabError(
            f"logger.tracking_uri={uri}: the server answered HTTP {response.status_code} to /health"
        )

    check_credentials(
        uri
    )  # a server with sign-in: a wrong password is one line, before any run opens


def artifact_location(
    uri: str, artifact_root: Optional[str], experiment_name: str
) -> Optional[str]:
    """A local store needs an explicit artifact folder (MLflow would pick one relative to the
    working directory); a server decides its own."""
    if artifact_root is None or is_server(uri):
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment_name).strip("_") or "default"
    return (Path(artifact_root).resolve() / safe).as_uri()


def ensure_experiment(
    client: mlflow.MlflowClient, name: str, artifact_location: Optional[str]
) -> str:

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # made before seqlab marked its experiments
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return experiment.experiment_id
    try:
        # Marked as model training: MLflow's UI opens it on its runs, not on a GenAI traces page.
        return client.create_experiment(
            name, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING}
        )
    except MlflowException:
        # Another job of the same sweep created it between our look-up and our create.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def open_tracker(logger_cfg: Any, job: Any, sweep: Any) -> Any:
    """A job's tracker, from conf/logger/ (`job`: sweeps.job.Job, `sweep`: its SweepInfo); in a
    parallel sweep over a local store, pointed at the sweep's own server. Processes 1..N-1 of a
    DDP job send nothing (rank 0 records the job)."""

    tracker = instantiate(logger_cfg, rank=job.rank)
    if job.rank > 0:
        logging.getLogger("seqlab").setLevel(logging.WARNING)  # rank 0 reports the job
    routed = sweep.routed(tracker.tracking_uri)
    if routed != tracker.tracking_uri:
        # The sweep's own server may still be starting; what answers must be that server.
        wait_until_up(
            routed,
            timeout_s=120,
            log_path=job.sweep_dir / "mlflow_server.log",
            pid=sweep.server_pid,
        )
        tracker.tracking_uri = routed
    return tracker
