"""The MLflow tracking server, started one way for three users: `make server` (a shared server
for a team or a machine), a parallel sweep's own loopback server (see sweeps/callback.py), and the tests.

The server owns the store (SQLite by default, PostgreSQL in production) and serves artifacts
itself (`--serve-artifacts`), so its clients need only its address, no shared disk.

`python -m seqlab.store.server --help` lists the options; nothing heavy is imported to answer it."""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlparse

import psutil
import requests

from seqlab import SeqlabError
from seqlab.secrets import mask_uris
from seqlab.store import server_auth
from seqlab.store.server_command import (
    ARTIFACTS_ENV,
    BACKEND_ENV,
    check_backend,
    command,
    stores_env,
    uvicorn_command,
    uvicorn_env,
)

# What `make server` uses unless told otherwise: its own store beside the local one, so runs sent
# to the server get artifact locations the server serves (mlflow-artifacts:/...), never paths on
# one client's disk.
DEFAULT_DIR = "mlruns/server"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's process, before it starts: end when the process that started it ends,
    however that ends (Linux; elsewhere the stop() calls and atexit do it)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_until_up(
    uri: str,
    proc: Optional[subprocess.Popen] = None,
    timeout_s: float = 90.0,
    log_path: Optional[Path] = None,
    pid: Optional[int] = None,
) -> None:
    """Return once the server at `uri` answers. Its process, where known (`proc`, or `pid` for one
    another process started, as a sweep's jobs know their sweep's server), must be the one that
    answers, and its end while starting is one line."""

    def last_line() -> str:
        lines = (
            log_path.read_text(errors="replace").strip().splitlines()
            if log_path and log_path.is_file()
            else []
        )
        return f": {lines[-1]} (see {log_path})" if lines else ""

    deadline = time.monotonic() + timeout_s
    port = urlparse(uri).port
    owner = proc.pid if proc is not None else pid
    while True:
        try:
            # With the process at hand, the answer must come from it: another program may have
            # taken the port between free_port() and the server's start (a scoring server's
            # /health answers too).
            if requests.get(f"{uri}/health", timeout=2).status_code == 200 and (
                owner is None or _listens(owner, port)
            ):
                return
        except requests.RequestException:
            pass
        if proc is not None and proc.poll() is not None:
            detail = last_line()
            raise SeqlabError(
                f"the MLflow server for {uri} exited with status {proc.returncode} while starting{detail}"
            )
        if proc is None and pid is not None and not _alive(pid):
            raise SeqlabError(f"the MLflow server for {uri} (pid {pid}) is gone{last_line()}")
        if time.monotonic() > deadline:
            raise SeqlabError(
                f"the MLflow server for {uri} did not answer within {timeout_s:.0f} s{last_line()}"
            )
        time.sleep(0.3)


def _alive(pid: int) -> bool:

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _listens(pid: int, port: Optional[int]) -> bool:
    """Whether process `pid` or a process it started listens on `port`."""

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for member in family:
        try:
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                for c in member.net_connections("tcp")
            ):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def _taken(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class LocalServer:
    """An MLflow server in a child process on a loopback port, stopped on `stop()` or at the end
    of a `with` block. Its output goes to `log_path` (or nowhere)."""

    def __init__(
        self,
        backend_store_uri: str,
        artifacts_destination: str,
        port: Optional[int] = None,
        host: str = "127.0.0.1",
        log_path: Optional[Path] = None,
        auth_env: Optional[dict[str, str]] = None,
    ) -> None:
        check_backend(backend_store_uri)
        self.host = host
        self.chose_port = port is None  # a port of its own choosing can be chosen again
        # auth_env (server_auth.auth_environment): the server signs users in.
        self.auth_env = auth_env or {}
        self.log_path = log_path
        self.proc: Optional[subprocess.Popen] = None
        self.stores = stores_env(backend_store_uri, artifacts_destination)
        # Sign-in needs `mlflow server` (it creates the admin user before uvicorn starts).
        if auth_env:
            self._command = functools.partial(command, host, app_name=server_auth.APP_NAME)
            self.env = {**self.stores, **self.auth_env}
        else:
            self._command = functools.partial(uvicorn_command, host)
            self.env = uvicorn_env(self.stores)
        self._use(port or free_port(host))

    def _use(self, port: int) -> None:
        self.port = port
        self.uri = f"http://{self.host}:{port}"
        self.cmd = self._command(port=port)

    def start(self, wait: bool = True) -> "LocalServer":
        """Start the server; with wait, return once it answers (else see `wait_until_up`). A port
        it chose that another program took before the server bound it is chosen again (twice)."""
        for attempt in range(3):
            self._spawn()
            if not wait:
                return self
            try:
                wait_until_up(self.uri, self.proc, log_path=self.log_path)
                if not self.auth_env:
                    self._open_store()
                return self
            except BaseException as error:
                self.stop()
                if not isinstance(error, SeqlabError):  # Ctrl-C, a bug: no second try
                    raise
                exited = self.proc.returncode not in (None, -signal.SIGTERM, -signal.SIGKILL)
                if not (
                    self.chose_port and exited and attempt < 2 and _taken(self.host, self.port)
                ):
                    raise
                self._use(free_port(self.host))
        return self

    def _open_store(self) -> None:
        """One request that opens the store, so that a new one's tables are made by it alone: uvicorn's
        MLflow opens its store at the first request that needs it, without a lock, and two clients'
        first requests at once would both make the tables (`mlflow server` makes them before it
        starts uvicorn; a sweep's parent makes them before its jobs start)."""

        answer = requests.get(
            f"{self.uri}/api/2.0/mlflow/experiments/get-by-name",
            params={"experiment_name": "Default"},
            timeout=120,
        )
        if answer.status_code != 200:
            raise SeqlabError(
                f"the MLflow server for {self.uri} cannot open its store: {answer.text[:300]}"
            )

    def _spawn(self) -> None:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group, so that its workers stop with it; MLflow's background
                # job runner is not needed for tracking.
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env={**os.environ, **self.env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _auth_dir(backend_store_uri: str) -> Path:
    """Where a server with sign-in keeps its users: beside its SQLite store, else in mlruns/server."""
    if backend_store_uri.startswith("sqlite:///"):
        return Path(backend_store_uri[len("sqlite:///") :]).parent
    return Path(DEFAULT_DIR).resolve()


def _parser() -> argparse.ArgumentParser:
    """The command line of `make server` (python -m seqlab.store.server)."""
    parser = argparse.ArgumentParser(
        prog="python -m seqlab.store.server",
        description="Start an MLflow tracking server that stores runs in a database and serves their "
        "artifacts, so that clients need only its address (logger=mlflow_server or "
        "MLFLOW_TRACKING_URI=http://HOST:PORT).",
    )
    # Also from the environment (make server passes them so): a password on a command line is
    # there for every user of the machine to read.
    parser.add_argument(
        "--backend-store-uri",
        default=os.environ.get(BACKEND_ENV) or f"sqlite:///{Path(DEFAULT_DIR).resolve()}/mlflow.db",
        help=f"sqlite:///path/mlflow.db (default: {BACKEND_ENV} or sqlite under {DEFAULT_DIR}/) or "
        "postgresql://user:password@host:5432/db (better in the environment: a command line is public)",
    )
    parser.add_argument(
        "--artifacts-destination",
        default=os.environ.get(ARTIFACTS_ENV) or str(Path(DEFAULT_DIR).resolve() / "artifacts"),
        help=f"a folder or s3://bucket/path where the server keeps artifacts (default: {ARTIFACTS_ENV} "
        f"or {DEFAULT_DIR}/artifacts)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="127.0.0.1 (this machine only, the default) or 0.0.0.0 (a shared server: users sign in; "
        f"the admin's password from {server_auth.ADMIN_PASSWORD} or --admin-password-file, "
        f"or {server_auth.ALLOW_OPEN}=1 to serve it open)",
    )
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (default 1; more only with PostgreSQL: SQLite takes one writer at a time)",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="sign users in on a loopback host too (always on for other hosts)",
    )
    parser.add_argument(
        "--admin-password-file",
        default=None,
        help=f"a file whose first line is the admin's password (else {server_auth.ADMIN_PASSWORD}); "
        "needed on the first start with sign-in, when the admin user is created",
    )
    parser.add_argument(
        "--admin-username",
        default=None,
        help=f"the admin user created on the first start (default: {server_auth.ADMIN_USERNAME} or admin)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_backend(args.backend_store_uri)
        auth_env = server_auth.auth_environment(
            args.host,
            _auth_dir(args.backend_store_uri),
            args.auth,
            args.admin_password_file,
            args.admin_username,
        )
    except SeqlabError as error:
        # The store's address as given may hold its password; the message's own examples do not.
        print(
            f"error: {str(error).replace(args.backend_store_uri, mask_uris(args.backend_store_uri))}",
            file=sys.stderr,
        )
        return 2
    cmd = command(
        args.host, args.port, args.workers, app_name=server_auth.APP_NAME if auth_env else None
    )
    address = f"http://{args.host}:{args.port}"
    print(
        f"MLflow server on {address} (store {mask_uris(args.backend_store_uri)}, "
        f"artifacts {mask_uris(args.artifacts_destination)})",
        flush=True,
    )
    if auth_env:
        print(
            f"sign-in   on (MLflow basic-auth; users in {Path(auth_env[server_auth.CONFIG_PATH]).parent}/basic_auth.db); "
            f"clients set {server_auth.USERNAME} and {server_auth.PASSWORD}",
            flush=True,
        )
    elif not server_auth.is_loopback(args.host):
        print(
            f"warning   no sign-in ({server_auth.ALLOW_OPEN}=1): anyone who reaches {address} can read and change "
            "every run",
            flush=True,
        )
    print(
        f"send runs to it: python train.py logger=mlflow_server logger.tracking_uri={address}",
        flush=True,
    )
    env = {
        **os.environ,
        **stores_env(args.backend_store_uri, args.artifacts_destination),
        **(auth_env or {}),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    os.execvpe(cmd[0], cmd, env)  # the server in the foreground: Ctrl-C stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
