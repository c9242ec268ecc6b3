"""A tracking server nobody walks into: sign-in on a shared server, the refusal to start one open,
the clients' credentials, and a password in the tracking URI that is used but never recorded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import requests
from conftest import ROOT, TINY, artifact_paths, no_runs, runs_of
from harness.inprocess import run_script

from seqlab.store.server import free_port, wait_until_up

ADMIN, PASSWORD = "alice", "s3cret-passw0rd"  # MLflow wants 12 characters or more


def _server_env(**extra: str) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "HYDRA_")) and k != "ALLOW_UNAUTHENTICATED"
    }
    return {**keep, **extra}


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """`python -m seqlab.store.server --auth` on a free loopback port: the same sign-in as a shared
    server's, reachable from this machine only."""
    base = tmp_path_factory.mktemp("auth-server")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "seqlab.store.server",
            "--auth",
            "--admin-username",
            ADMIN,
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{base}/mlflow.db",
            "--artifacts-destination",
            str(base / "artifacts"),
        ],
        stdout=open(base / "server.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=_server_env(MLFLOW_AUTH_ADMIN_PASSWORD=PASSWORD),
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(uri, proc, log_path=base / "server.log")
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _signed_in(uri: str, monkeypatch) -> mlflow.MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    return mlflow.MlflowClient(uri)


def test_a_shared_server_without_an_admin_password_refuses_to_start(tmp_path):
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqlab.store.server",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/server/mlflow.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=_server_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --host 0.0.0.0 lets other machines in, so the server signs users in and needs its admin's "
        "password: set MLFLOW_AUTH_ADMIN_PASSWORD (or --admin-password-file FILE; make server "
        "ADMIN_PASSWORD_FILE=FILE), 12 characters or more; or serve it open with ALLOW_UNAUTHENTICATED=1"
    ]
    assert "Traceback" not in proc.stdout + proc.stderr
    with socket.socket() as s:  # it exited before binding anything
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not (tmp_path / "server" / "basic_auth.db").exists()


def test_the_right_credentials_land_and_a_wrong_password_is_one_line(
    auth_server, run_cli, store, monkeypatch
):
    assert (
        requests.get(
            f"{auth_server}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10
        ).status_code
        == 401
    )
    signed_in = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    proc = run_cli(
        *TINY,
        "logger=mlflow_server",
        "logger.experiment_name=signed-in",
        f"logger.tracking_uri={auth_server}",
        env=signed_in,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = _signed_in(auth_server, monkeypatch)
    (run,) = runs_of(client, "signed-in")
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 8
    assert "checkpoints/last.ckpt" in artifact_paths(
        client, run.info.run_id
    )  # artifacts went through the sign-in too

    wrong = run_cli(
        *TINY,
        "logger=mlflow_server",
        "logger.experiment_name=wrong-password",
        f"logger.tracking_uri={auth_server}",
        env={**signed_in, "MLFLOW_TRACKING_PASSWORD": "not-the-password"},
    )
    out = wrong.stdout + wrong.stderr
    assert wrong.returncode == 1
    assert [line for line in out.splitlines() if line.strip()] == [
        f"error: the tracking server at {auth_server} refused the sign-in (user 'alice'): "
        "check MLFLOW_TRACKING_PASSWORD (or the password in logger.tracking_uri)"
    ]
    assert client.get_experiment_by_name("wrong-password") is None  # nothing was written
    assert no_runs(store)  # nor anything into the local store


def test_a_password_in_the_tracking_uri_is_used_but_never_recorded(
    auth_server, run_cli, store, tmp_path, monkeypatch
):
    with_password = auth_server.replace("http://", f"http://{ADMIN}:{PASSWORD}@")
    proc = run_cli(
        *TINY,
        "logger=mlflow_server",
        "logger.experiment_name=uri-password",
        f"logger.tracking_uri={with_password}",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert PASSWORD not in out
    assert f"at {auth_server}" in out  # the printed address: the server's, without the credentials

    client = _signed_in(auth_server, monkeypatch)
    (run,) = runs_of(client, "uri-password")  # the run connected with the URI's credentials
    assert run.info.status == "FINISHED"
    masked = auth_server.replace("http://", f"http://{ADMIN}:***@")
    assert run.data.params["logger.tracking_uri"] == masked
    assert f"logger.tracking_uri={masked}" in run.data.tags["hydra_overrides"].split()
    assert [k for k, v in {**run.data.params, **run.data.tags}.items() if PASSWORD in v] == []

    downloaded = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "downloaded")))
    files = {str(p.relative_to(downloaded)): p for p in downloaded.rglob("*") if p.is_file()}
    assert {
        "config.yaml",
        "train.log",
        "hydra/overrides.yaml",
        "hydra/hydra.yaml",
        "hydra/config.yaml",
    } <= set(files)
    assert [name for name, p in files.items() if PASSWORD.encode() in p.read_bytes()] == []
    assert f"logger.tracking_uri={masked}" in files["hydra/overrides.yaml"].read_text()
    # The user's own files are left as they were: the masked copies are what was uploaded.
    (job_dir,) = (tmp_path / "logs" / "runs").iterdir()
    assert PASSWORD in (job_dir / ".hydra" / "overrides.yaml").read_text()
    assert no_runs(store)


def test_compare_signs_in_too_and_a_wrong_password_is_one_line(auth_server, tmp_path):
    script = ROOT / "scripts" / "compare.py"
    wrong = auth_server.replace("http://", f"http://{ADMIN}:not-the-password@")
    proc = run_script(script, ["--tracking-uri", wrong, "--out", str(tmp_path / "cmp"), "--no-log"])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: the tracking server at {auth_server} refused the sign-in (user 'alice'): "
        "check MLFLOW_TRACKING_PASSWORD (or the password in logger.tracking_uri)"
    ]
    assert "not-the-password" not in proc.stdout + proc.stderr
    right = run_script(
        script,
        [
            "--tracking-uri",
            auth_server,
            "--experiment",
            "no-such",
            "--out",
            str(tmp_path / "cmp"),
            "--no-log",
        ],
        env={"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD},
    )
    assert "refused the sign-in" not in right.stderr and "Traceback" not in right.stderr, (
        right.stderr[-2000:]
    )
    assert (
        right.returncode == 1 and "error: " in right.stderr
    )  # signed in; the experiment is not there
