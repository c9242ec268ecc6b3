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


# MLflow's default store is sqlite:///mlflow.db in the working folder: a test that reaches MLflow
# without a tracking URI would leave one in the repository (one was committed by mistake, twice).
_STRAY_STORE = ROOT / "mlflow.db"
_stray_before = _STRAY_STORE.exists()


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or _stray_before or not _STRAY_STORE.exists():
        return  # a worker (the controller checks), or nothing new
    print(f"\nerror: a test created {_STRAY_STORE}: it reached MLflow without a tracking URI")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    import torch

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
    process (tests/harness/inprocess.py: the same entry, argv, folder and environment; exit status and
    output as a process gives them). A new Python spends 5-8 s on imports; tests about the
    process itself (signals, kill, parallel launchers, interpreter exit) use run_process or
    start_cli."""
    from harness.inprocess import run_in_process

    def _run(
        *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return run_in_process([*args, f"paths.root_dir={tmp_path}"], tmp_path, cli_env(env))

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
    process of its own (tests/harness/zygote.py): a Popen-like handle."""
    from harness import zygote

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
