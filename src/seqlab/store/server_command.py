"""What starts an MLflow tracking server: the store check, the command line (`mlflow server`, or
the uvicorn process it would start) and the environment that carries the stores. The stores go in
the environment, never on the command line. seqlab.store.server starts and watches the process."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Optional

from seqlab import SeqlabError


def check_backend(backend_store_uri: str) -> None:
    """Refuse, in one line, a store the server could not open (MLflow would say so in a long trace)."""
    scheme = backend_store_uri.split(":", 1)[0].split("+", 1)[0]
    if scheme == "postgresql":
        try:
            import psycopg  # noqa: F401  (SQLAlchemy 2.1's default PostgreSQL driver)
        except ImportError:
            raise SeqlabError(
                f"--backend-store-uri {backend_store_uri}: PostgreSQL needs its driver; "
                "install it with .venv/bin/pip install -e '.[postgres]'"
            ) from None
    elif scheme == "sqlite":
        path = backend_store_uri[len("sqlite:///") :]
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    elif scheme not in ("mysql", "mssql"):
        raise SeqlabError(
            f"--backend-store-uri {backend_store_uri}: MLflow 3 needs a database here "
            "(sqlite:///path/mlflow.db or postgresql://user:password@host/db), not a folder"
        )


# The server's stores go to it in its environment, not on its command line, which every user of
# the machine can read (ps): a PostgreSQL URL holds a password, an artifact URL may hold a key.
BACKEND_ENV, ARTIFACTS_ENV = "MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"


def stores_env(backend_store_uri: str, artifacts_destination: str) -> dict[str, str]:
    return {BACKEND_ENV: backend_store_uri, ARTIFACTS_ENV: artifacts_destination}


def command(
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    app_name: Optional[str] = None,
) -> list[str]:
    """`mlflow server`'s command line; its stores come from stores_env."""
    mlflow_cli = Path(sys.executable).parent / "mlflow"
    return [
        str(mlflow_cli) if mlflow_cli.exists() else "mlflow",
        "server",
        "--serve-artifacts",
        "--host",
        host,
        "--port",
        str(port),
        # One worker process: a SQLite store takes one writer at a time, and one process with
        # its own pool is what keeps concurrent clients from "database is locked".
        "--workers",
        str(workers),
        *(["--app-name", app_name] if app_name else []),
    ]


# What `mlflow server` hands its uvicorn process (mlflow/server/__init__.py: _run_server, with the
# names of mlflow/server/constants.py; test_scale checks them against the pinned MLflow). A
# loopback server starts uvicorn itself with them: `mlflow server` is a second Python in front of
# uvicorn that imports MLflow's CLI and opens the store once more only to start it (2.5 of its
# 6 s of CPU on the 2-core VM), and every parallel sweep and most server tests start one.
_SERVER_ENV = {
    BACKEND_ENV: "_MLFLOW_SERVER_FILE_STORE",
    ARTIFACTS_ENV: "_MLFLOW_SERVER_ARTIFACT_DESTINATION",
}
_SERVER_FIXED_ENV = {
    "_MLFLOW_SERVER_SERVE_ARTIFACTS": "true",
    "_MLFLOW_SERVER_ARTIFACT_ROOT": "mlflow-artifacts:/",  # what --serve-artifacts resolves the default root to
    "_MLFLOW_SGI_NAME": "uvicorn",
    "_MLFLOW_IN_JOB_EXECUTOR": "false",
}


def uvicorn_command(host: str, port: int) -> list[str]:
    """The uvicorn command line `mlflow server --workers 1` starts (its _build_uvicorn_command)."""

    log_config = (
        Path(importlib.util.find_spec("mlflow").origin).parent
        / "server"
        / "uvicorn_log_config.yaml"
    )
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--log-config",
        str(log_config),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "mlflow.server.fastapi_app:app",
    ]


def uvicorn_env(stores: dict[str, str]) -> dict[str, str]:
    """The environment `mlflow server` gives its uvicorn process, for the stores of stores_env."""

    backend = stores[BACKEND_ENV]
    return {
        _SERVER_ENV[BACKEND_ENV]: backend,
        "_MLFLOW_SERVER_REGISTRY_STORE": backend,
        _SERVER_ENV[ARTIFACTS_ENV]: stores[ARTIFACTS_ENV],
        **_SERVER_FIXED_ENV,
        "_MLFLOW_SERVER_BOOT_ID": uuid.uuid4().hex,
    }
