"""A tracking server nobody walks into: sign-in on a shared server, the refusal to start one open,
the clients' credentials, and a password in the tracking URI that is used but never recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqlab import SeqlabError
from seqlab.store.server_auth import auth_environment

ADMIN, PASSWORD = "alice", "s3cret-passw0rd"  # MLflow wants 12 characters or more


def test_sign_in_is_on_beyond_loopback_off_on_it_and_open_only_when_asked(tmp_path, monkeypatch):
    for name in (
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_AUTH_ADMIN_USERNAME",
        "ALLOW_UNAUTHENTICATED",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    assert auth_environment("127.0.0.1", tmp_path) is None
    assert auth_environment("localhost", tmp_path) is None
    monkeypatch.setenv("ALLOW_UNAUTHENTICATED", "1")
    assert auth_environment("0.0.0.0", tmp_path) is None  # said outright: open
    with pytest.raises(SeqlabError, match="needs its admin's password"):
        auth_environment(
            "127.0.0.1", tmp_path, want_auth=True
        )  # asked for sign-in: a password is still needed
    monkeypatch.delenv("ALLOW_UNAUTHENTICATED")
    with pytest.raises(SeqlabError, match="at least 12 characters"):
        monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "short")
        auth_environment("10.1.2.3", tmp_path)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD")
    secret_file = tmp_path / "admin-password"
    secret_file.write_text(PASSWORD + "\n")
    env = auth_environment("0.0.0.0", tmp_path / "server", password_file=str(secret_file))
    assert (
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] == PASSWORD
    )  # handed to the server through its environment
    ini = Path(env["MLFLOW_AUTH_CONFIG_PATH"]).read_text()
    assert PASSWORD not in ini and "admin_username = admin" in ini
    assert (
        "auth_cache_ttl_seconds = 60" in ini
    )  # a run's every request is not a 0.1 s password hash
    assert f"database_uri = sqlite:///{tmp_path / 'server' / 'basic_auth.db'}" in ini
    key = env["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    assert len(key) == 64 and (tmp_path / "server" / "flask_secret_key").stat().st_mode & 0o077 == 0
    # Once the admin exists (its user store is there), a restart needs no password, and keeps the key.
    (tmp_path / "server" / "basic_auth.db").touch()
    again = auth_environment("0.0.0.0", tmp_path / "server")
    assert (
        "MLFLOW_AUTH_ADMIN_PASSWORD" not in again and again["MLFLOW_FLASK_SERVER_SECRET_KEY"] == key
    )
