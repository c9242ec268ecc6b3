"""Fixtures of the integration tier only: a server, PostgreSQL, SLURM, and train.py in a process
of its own. The unit tier (tests/unit) starts no process and never loads these."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import POSTGRES_PASSWORD, ROOT, cli_env


@pytest.fixture(scope="session", autouse=True)
def _helpers_forked():
    """A run inside this process (run_cli's command lines, a test's own `train(cfg)`) starts its
    delivery process from tests/harness/zygote.py: the same `python -m seqlab.delivery.helper`,
    without a new Python's imports (Matplotlib's alone is 0.5 s of CPU for each figure's helper,
    and the suite starts about 200). A run in a process of its own (start_cli, run_process) still
    starts a new Python, as a user's does."""
    from harness import zygote

    from seqlab.delivery.helper import Delivery

    own = Delivery.__dict__["launch"]
    Delivery.launch = staticmethod(zygote.popen)
    yield
    Delivery.launch = own


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One MLflow tracking server for the whole test run (starting one costs seconds). Tests that
    use it keep to an experiment of their own; tests that stop a server start their own."""
    from seqlab.store.server import LocalServer

    root = tmp_path_factory.mktemp("server")
    with LocalServer(f"sqlite:///{root}/mlflow.db", str(root / "artifacts")) as server:
        yield server


@pytest.fixture
def run_process(tmp_path):
    """Run train.py in a process of its own, as a user would, with every path under tmp_path: a
    child of tests/harness/zygote.py, which has made the imports a new Python would spend 5-8 s on."""
    from harness import zygote

    def _run(
        *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return zygote.run(
            [str(ROOT / "train.py"), *args, f"paths.root_dir={tmp_path}"],
            tmp_path,
            cli_env(env),
            timeout=timeout,
        )

    return _run


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL cluster on a loopback port that wants a password (as a team's
    does), with databases `mlflow` and `optuna`; its URL for `mlflow`, password included.
    Skipped where PostgreSQL is not installed."""
    import tempfile

    from seqlab.store.server import free_port

    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed")
    as_user = (
        ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    )  # initdb refuses root
    base = Path(tempfile.mkdtemp(prefix="seqlab-pg-"))
    base.chmod(0o777)
    data, port = base / "data", free_port()
    (base / "pw").write_text(POSTGRES_PASSWORD + "\n")
    (base / "pw").chmod(0o644)
    env = {**os.environ, "PGPASSWORD": POSTGRES_PASSWORD}

    def run(*cmd):
        return subprocess.run(
            [*as_user, *cmd], check=True, capture_output=True, timeout=120, env=env
        )

    try:
        run(
            "initdb",
            "-D",
            str(data),
            "-U",
            "seqlab",
            "--auth=scram-sha-256",
            f"--pwfile={base / 'pw'}",
        )
        run(
            "pg_ctl",
            "-D",
            str(data),
            "-w",
            "-l",
            str(base / "log"),
            "start",
            "-o",
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
        )
        for database in ("mlflow", "optuna"):
            run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "seqlab", database)
        yield f"postgresql://seqlab:{POSTGRES_PASSWORD}@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(
            [*as_user, "pg_ctl", "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node SLURM cluster on loopback (tests/harness/slurm_cluster.py), one per test run: its `env`
    (SLURM_CONF, PATH) points a command at it. Skipped where SLURM's packages are absent or the
    daemons cannot run as root (.ci/run installs slurm-wlm)."""
    from harness import slurm_cluster

    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
