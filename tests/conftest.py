"""Shared fixtures: configs composed from conf/ with every path under tmp_path, helpers that run
the command line (in this process, or in a process of its own), and an MLflow client on the
test's own store."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# pytest-xdist runs a test file per core at once: each worker takes its share of the cores for
# torch (read when torch is imported, after this), as a parallel launcher's jobs do
# (seqlab.sweeps.job.Job.cpu_share). Two workers each running torch on every core oversubscribe the
# machine: the suite took 5 min 45 s instead of 4 min 50 s on the 2-core VM.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault(
        "OMP_NUM_THREADS",
        str(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))),
    )

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

import seqlab.schema  # noqa: E402,F401  registers the schema the configs build on
from seqlab.hydra_version import VERSION_BASE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"

# Small and quick: every test that trains starts from these.
TINY = ["data.n_samples=256", "trainer.max_epochs=2"]


# Seconds each file took (setup, call and teardown summed, --durations=0 of the whole suite on this
# session's 2-core VM, two xdist workers, quiet, 2026-12-02). xdist hands out whole files in the
# order collected (--no-loadscope-reorder): the longest first, so that no long file starts last
# while the other worker has nothing left (the suite's tail). A file not listed costs little and
# goes after these.
FILE_SECONDS = {
    "test_pack_runs.py": 122,
    "test_readme.py": 90,
    "test_search.py": 106,
    "test_scale.py": 92,
    "test_robust.py": 73,
    "test_cluster.py": 69,
    "test_repeats.py": 48,
    "test_preemption.py": 43,
    "test_perf.py": 41,
    "test_search_workers.py": 33,
    "test_study.py": 33,
    "test_rank_failure.py": 33,
    "test_checkpoints.py": 29,
    "test_hydra_next.py": 29,
    "test_run_to_use.py": 25,
    "test_config.py": 23,
    "test_step_writer.py": 23,
    "test_train.py": 19,
    "test_server_auth.py": 16,
    "test_store.py": 16,
    "test_bad_input.py": 14,
    "test_own_data.py": 13,
    "test_checkpoint_models.py": 13,
    "test_packing.py": 7,
    "test_sync.py": 5,
}


def pytest_collection_modifyitems(config, items):
    import torch

    # sorted() is stable: a file's tests keep their order.
    items[:] = sorted(items, key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory):
    import mlflow

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()  # creates and migrates the tables
    return path


@pytest.fixture(autouse=True)
def _migrated_store(request, tmp_path, _empty_store):
    """Every test's store (tmp_path/mlruns/mlflow.db) starts empty with its tables made: MLflow
    takes about 1.5 s to create them, paid here once a session instead of once a test. Tests of
    a brand-new store are marked `fresh_store`."""
    if request.node.get_closest_marker("fresh_store") is None:
        (tmp_path / "mlruns").mkdir(exist_ok=True)
        shutil.copy(_empty_store, tmp_path / "mlruns" / "mlflow.db")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One MLflow tracking server for the whole test run (starting one costs seconds). Tests that
    use it keep to an experiment of their own; tests that stop a server start their own."""
    from seqlab.store.server import LocalServer

    root = tmp_path_factory.mktemp("server")
    with LocalServer(f"sqlite:///{root}/mlflow.db", str(root / "artifacts")) as server:
        yield server


def no_runs(client) -> bool:
    return not [
        r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
    ]


@pytest.fixture(autouse=True)
def _no_tracking_server_from_the_environment(monkeypatch):
    # MLFLOW_TRACKING_URI picks the store (conf/paths); a developer's own must not leak in.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    # What the reaper has seen of other hosts' heartbeats (seqlab.store.ghosts.BeatsSeen): each test's own.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def compose_in(root, *overrides: str):
    """train.yaml composed with `overrides`, every path under `root`, its job's folder root/out."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose(
            "train",
            overrides=[f"paths.root_dir={root}", f"paths.output_dir={root}/out", *overrides],
        )


@pytest.fixture
def compose_cfg(tmp_path):
    """compose_cfg('data.batch_size=32', ...) -> the composed config, stored under tmp_path."""

    def _compose(*overrides: str):
        # The ONNX copy of the network costs a run about half a second: tests of it (test_onnx.py),
        # and every command-line run, make it; a config composed here, unless a test asks.
        return compose_in(tmp_path, "logger.log_onnx=false", *overrides)

    return _compose


@pytest.fixture
def store(tmp_path):
    """The MLflow client over the store that configs from compose_cfg/run_cli write to."""
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would steer a command line elsewhere (a
    developer's MLFLOW_TRACKING_URI, Hydra's variables from a surrounding run), plus `env`."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "MLFLOW_TRACKING_URI"))
    }
    return {**base, **(env or {})}


@pytest.fixture
def run_cli(tmp_path):
    """Run train.py's command line as a user would, with every path under tmp_path, inside this
    process (tests/inprocess.py: the same entry, argv, folder and environment; exit status and
    output as a process gives them). A new Python spends 5-8 s on imports; tests about the
    process itself (signals, kill, parallel launchers, interpreter exit) use run_process or
    start_cli."""
    from inprocess import run_in_process

    def _run(
        *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return run_in_process([*args, f"paths.root_dir={tmp_path}"], tmp_path, cli_env(env))

    return _run


@pytest.fixture
def run_process(tmp_path):
    """Run train.py in a process of its own, as a user would, with every path under tmp_path: a
    child of tests/zygote.py, which has made the imports a new Python would spend 5-8 s on."""
    import zygote

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


def start_cli(
    tmp_path,
    *args: str,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    new_session: bool = False,
    env: dict[str, str] | None = None,
):
    """train.py started as a user would, in the background (for tests that signal or stop it), in a
    process of its own (tests/zygote.py): a Popen-like handle."""
    import zygote

    return zygote.start(
        [str(ROOT / "train.py"), *args, f"paths.root_dir={tmp_path}"],
        tmp_path,
        cli_env(env),
        stdout=stdout,
        stderr=stderr,
        new_session=new_session,
    )


def runs_of(client, experiment_name: str):
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"no experiment {experiment_name!r}"
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def artifact_paths(client, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found.add(item.path)
        if item.is_dir:
            found |= artifact_paths(client, run_id, item.path)
    return found


POSTGRES_PASSWORD = "pg-secret-4711"  # the test cluster's; no output, tag or file may show it


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL cluster on a loopback port that wants a password (as a team's
    does), with databases `mlflow` and `optuna`; its URL for `mlflow`, password included.
    Skipped where PostgreSQL is not installed."""
    import shutil
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
    """A one-node SLURM cluster on loopback (tests/slurm_cluster.py), one per test run: its `env`
    (SLURM_CONF, PATH) points a command at it. Skipped where SLURM's packages are absent or the
    daemons cannot run as root (.ci/run installs slurm-wlm)."""
    import slurm_cluster

    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
