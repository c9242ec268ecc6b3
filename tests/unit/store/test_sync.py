"""Compute nodes without the server: runs tracked into a local store, copied into the tracking
server by scripts/sync.py, whole and once."""

from __future__ import annotations

from harness.inprocess import run_script
from harness.sync import SYNC


def test_sync_needs_a_destination_and_an_existing_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    nowhere = run_script(SYNC, ["--from", f"sqlite:///{tmp_path}/mlruns/mlflow.db"])
    assert nowhere.returncode == 1
    assert (
        nowhere.stderr.strip()
        == "error: say where the runs go: --to http://host:5000 (or set MLFLOW_TRACKING_URI)"
    )
    missing = run_script(
        SYNC, ["--from", f"sqlite:///{tmp_path}/none/mlflow.db", "--to", "http://127.0.0.1:9"]
    )
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"error: --from sqlite:///{tmp_path}/none/mlflow.db: no such store"
    )
