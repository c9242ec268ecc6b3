"""Secrets stay secret: what masks credentials in text, config trees, log records and uploaded
copies, and a run whose config holds a database password."""

from __future__ import annotations

import io
import logging

import pytest

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


def test_a_reopened_run_records_its_new_tags_masked(tmp_path, store):
    """resume= reopens a run with the new process's tags (hydra_overrides quotes the command line):
    they are masked as a new run's are, before the run shows RUNNING again."""
    from seqlab.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    overrides = "logger.fallback_uri=postgresql://bob:pg-pass-4711@db/mlflow"
    first = MlflowTracker(uri, "reopen")
    first.start("r", {"hydra_overrides": overrides})
    first.end("KILLED")
    again = MlflowTracker(uri, "reopen")
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
