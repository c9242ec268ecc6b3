"""Secrets stay secret: what masks credentials in text, config trees, log records and uploaded
copies, and a run whose config holds a database password."""

from __future__ import annotations

import io
import logging
import stat
from pathlib import Path

import pytest
from conftest import TINY, runs_of

from seqlab import secrets
from seqlab.store.server_auth import client_credentials


@pytest.fixture(autouse=True)
def _forget_secrets(monkeypatch):
    monkeypatch.setattr(secrets, "_known", set())  # each test learns its own


def test_credentials_in_uris_and_under_secret_keys_are_masked():
    text = (
        "logger.tracking_uri=http://alice:s3cret@127.0.0.1:5000 data.x_key=X +db.password=hunter22 "
        "paths.optuna_storage=postgresql://bob:pg-pass@db:5432/optuna?sslmode=require https://h/x?token=t0ken&a=b"
    )
    assert secrets.mask_text(text) == (
        "logger.tracking_uri=http://alice:***@127.0.0.1:5000 data.x_key=X +db.password=*** "
        "paths.optuna_storage=postgresql://bob:***@db:5432/optuna?sslmode=require https://h/x?token=***&a=b"
    )
    yaml = "db:\n  password: hunter22\n  x_key: X\n  api_token: null\n- data.source.api_key=k3y-value\n"
    assert (
        secrets.mask_text(yaml)
        == "db:\n  password: ***\n  x_key: X\n  api_token: null\n- data.source.api_key=***\n"
    )
    assert (
        secrets.mask_text('{"password": "hunter22", "author": "bob"}')
        == '{"password": "***", "author": "bob"}'
    )
    # Prose that names a setting is not a secret; a secret seen once is masked wherever it turns up.
    assert (
        secrets.mask_text("set MLFLOW_TRACKING_PASSWORD to the password: see the README")
        == "set MLFLOW_TRACKING_PASSWORD to the password: see the README"
    )
    assert (
        secrets.mask_text("could not open /tmp/hunter22 with s3cret")
        == "could not open /tmp/*** with ***"
    )


def test_a_config_tree_is_masked_by_key_and_value_without_changing_it():
    tree = {
        "data": {"x_key": "X", "y_key": "Y", "source": {"api_key": "abcd1234", "tokenizer": "bpe"}},
        "logger": {"tracking_uri": "http://alice:s3cret@host:5000", "experiment_name": "seqlab"},
        "credentials": {"user": "bob", "password": "hunter22"},
        "notes": "",
    }
    masked = secrets.mask_tree(tree)
    assert masked == {
        "data": {"x_key": "X", "y_key": "Y", "source": {"api_key": "***", "tokenizer": "bpe"}},
        "logger": {"tracking_uri": "http://alice:***@host:5000", "experiment_name": "seqlab"},
        "credentials": {"user": "***", "password": "***"},  # everything under a secret key
        "notes": "",
    }
    assert tree["credentials"]["password"] == "hunter22"  # the input is left as it was
    assert secrets.mask_flat({"data.source.api_key": "abcd1234", "data.x_key": "X"}) == {
        "data.source.api_key": "***",
        "data.x_key": "X",
    }


def test_log_records_and_their_tracebacks_are_masked():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test_secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        secrets.install_filter(logger)
        secrets.install_filter(logger)  # once per handler, however often it is asked
        assert len(handler.filters) == 1
        logger.warning("connecting to %s", "postgresql://bob:pg-pass-99@db/mlflow")
        try:
            raise ConnectionError("refused by postgresql://bob:pg-pass-99@db/mlflow")
        except ConnectionError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "pg-pass-99" not in text
    assert "connecting to postgresql://bob:***@db/mlflow" in text
    assert "ConnectionError: refused by postgresql://bob:***@db/mlflow" in text


def test_uploads_are_masked_copies_and_the_users_files_stay(tmp_path):
    folder = tmp_path / ".hydra"
    folder.mkdir()
    (folder / "overrides.yaml").write_text("- logger.tracking_uri=http://alice:s3cret@host\n")
    (folder / "weights.ckpt").write_bytes(b"\x00\x01s3cret\xff")
    with secrets.masked_copy(folder) as copy:
        assert copy != folder and copy.name == ".hydra"
        assert (
            copy / "overrides.yaml"
        ).read_text() == "- logger.tracking_uri=http://alice:***@host\n"
        assert (copy / "weights.ckpt").read_bytes() == b"\x00\x01s3cret\xff"  # not text: as it is
    assert not copy.exists()  # a temporary copy
    assert "s3cret" in (folder / "overrides.yaml").read_text()
    with secrets.masked_copy(folder / "weights.ckpt") as same:
        assert same == folder / "weights.ckpt"  # nothing to mask, nothing copied


def test_credentials_in_the_tracking_uri_go_to_mlflows_variables(monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")  # so that the test's end puts back what was there before
        monkeypatch.delenv(name)
    assert client_credentials("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert "MLFLOW_TRACKING_PASSWORD" not in __import__("os").environ
    assert (
        client_credentials("https://alice:p%40ss%3Aword@mlflow.example:8443/base")
        == "https://mlflow.example:8443/base"
    )
    import os

    assert (
        os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
        and os.environ["MLFLOW_TRACKING_PASSWORD"] == "p@ss:word"
    )
    # A database URI keeps its credentials: the driver needs them (they are masked where shown).
    assert client_credentials("postgresql://bob:pw@db/mlflow") == "postgresql://bob:pw@db/mlflow"


@pytest.mark.slow
def test_a_database_password_in_the_config_reaches_no_param_or_artifact(
    compose_cfg, store, tmp_path
):
    from seqlab.train import train

    password = "pg-pass-4711"
    cfg = compose_cfg(*TINY, f"paths.optuna_storage=postgresql://bob:{password}@dbhost:5432/optuna")
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    assert run.data.params["paths.optuna_storage"] == "postgresql://bob:***@dbhost:5432/optuna"
    assert [k for k, v in {**run.data.params, **run.data.tags}.items() if password in v] == []
    downloaded = Path(
        store.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "dl"))
    )
    assert "optuna_storage: postgresql://bob:***@dbhost:5432/optuna" in downloaded.read_text()
    assert (
        password in (tmp_path / "out" / "config.yaml").read_text()
    )  # the job's own folder is the user's


@pytest.mark.slow
def test_a_sweep_shows_and_records_no_password(run_cli, store, tmp_path):
    password = "pg-pass-4711"
    proc = run_cli(
        "-m", *TINY, f"paths.optuna_storage=postgresql://bob:{password}@dbhost:5432/optuna"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Hydra's list of jobs and the sweep's summary table, both as Hydra escapes the value
    assert "#0 : " in out and out.count("postgresql\\://bob\\:***@dbhost") == 2
    assert password not in out
    runs = runs_of(store, "seqlab")
    assert sorted(r.data.tags.get("sweep_role", "job") for r in runs) == ["job", "parent"]
    for run in runs:
        assert [k for k, v in {**run.data.params, **run.data.tags}.items() if password in v] == []
        downloaded = Path(
            store.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id))
        )
        files = [p for p in downloaded.rglob("*") if p.is_file()]
        assert files and [p.name for p in files if password.encode() in p.read_bytes()] == []


def test_a_reopened_run_records_its_new_tags_masked(tmp_path, store):
    """resume= reopens a run with the new process's tags (hydra_overrides quotes the command line):
    they are masked as a new run's are, before the run shows RUNNING again."""
    from seqlab.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    overrides = "logger.fallback_uri=postgresql://bob:pg-pass-4711@db/mlflow"
    first = MlflowTracker(uri, "reopen", step_writer="inline")
    first.start("r", {"hydra_overrides": overrides})
    first.end("KILLED")
    again = MlflowTracker(uri, "reopen", step_writer="inline")
    again.start(
        "r", {"hydra_overrides": overrides + " resume=" + first.run_id}, resume_run_id=first.run_id
    )
    again.end("FINISHED")
    tags = store.get_run(first.run_id).data.tags
    assert "pg-pass-4711" not in tags["hydra_overrides"]
    assert (
        tags["hydra_overrides"]
        == f"logger.fallback_uri=postgresql://bob:***@db/mlflow resume={first.run_id}"
    )


@pytest.mark.slow
def test_folders_holding_a_resolved_config_are_this_users_only(compose_cfg, run_cli, tmp_path):
    # Issue 24, point 6: config.yaml, Hydra's .hydra/ and train.log hold the resolved config (a
    # database password in paths.optuna_storage, say); other users of the machine must not read them.
    import stat

    from seqlab.train import train

    cfg = compose_cfg(*TINY)
    (tmp_path / "out").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out").chmod(0o755)
    train(cfg)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700
    proc = run_cli("-m", *TINY, "seed=0")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    (sweep,) = (tmp_path / "logs" / "multiruns").iterdir()
    assert stat.S_IMODE(sweep.stat().st_mode) == 0o700
    # Issue 34, point 2: a store this run creates is this user's only, its database and artifacts inside.
    single = run_cli(*TINY, f"logger.tracking_uri=sqlite:///{tmp_path}/fresh/mlflow.db")
    assert single.returncode == 0, (single.stdout + single.stderr)[-2000:]
    (run,) = (tmp_path / "logs" / "runs").iterdir()
    assert stat.S_IMODE(run.stat().st_mode) == 0o700 and (run / "config.yaml").is_file()
    assert (
        stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700
        and (tmp_path / "fresh" / "mlflow.db").is_file()
    )
    assert stat.S_IMODE((tmp_path / "fresh" / "mlflow.db.lock").stat().st_mode) == 0o600
    _another_user_reads(
        tmp_path,
        refused=[tmp_path / "fresh" / "mlflow.db", run / "config.yaml", sweep / "multirun.yaml"],
    )


def _another_user_reads(tmp_path, refused) -> None:
    """Issue 34, point 2, as another account of the machine sees it (where this test may add one: root
    with useradd): each path in `refused` is unreadable to it, while a file of tmp_path's own is read,
    so that the refusals are this project's modes and not a folder the other user cannot reach."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip(
            "another OS user needs root and useradd here; the modes themselves are checked above"
        )
    if subprocess.run(["id", "seqlab-other"], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/bin/sh", "seqlab-other"], check=True
        )
    opened = []
    for folder in [
        tmp_path,
        *tmp_path.parents,
    ]:  # pytest's own folders are root's only: let the other user through
        mode = folder.stat().st_mode
        if not mode & 0o001:
            opened.append((folder, mode))
            folder.chmod(stat.S_IMODE(mode) | 0o001)
    try:
        control = tmp_path / "readable.txt"
        control.write_text("anyone may read this\n")
        control.chmod(0o644)
        tmp_path.chmod(0o755)

        def cat(path):
            return subprocess.run(
                ["runuser", "-u", "seqlab-other", "--", "cat", str(path)],
                capture_output=True,
                text=True,
            )

        assert cat(control).returncode == 0, cat(control).stderr
        for path in refused:
            assert path.is_file(), path
            got = cat(path)
            assert got.returncode != 0 and "Permission denied" in got.stderr, (
                path,
                got.stdout[:200],
            )
    finally:
        for folder, mode in opened:
            folder.chmod(stat.S_IMODE(mode))
