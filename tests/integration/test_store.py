"""Issue 15, point 1: simultaneous first runs. Processes that open a new local store at once all
succeed (one creates it under a file lock, the others wait), and a store left half-created is
named in one line with the fix, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import TINY, runs_of, start_cli
from harness.store import _sql

from seqlab.store.local import half_created, open_client


def test_train_on_a_half_created_store_says_so_in_one_line(run_cli, tmp_path):
    db = tmp_path / "mlruns" / "mlflow.db"
    _sql(db, "CREATE TABLE _alembic_tmp_experiments (x INTEGER)")
    before = db.read_bytes()
    result = run_cli(*TINY)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("error:") or "ERROR" in line]
    assert errors == [f"error: {half_created(db)}"], out[-3000:]
    assert db.read_bytes() == before  # nothing in it was changed


@pytest.mark.fresh_store
def test_four_simultaneous_first_runs_on_a_new_store_all_finish(tmp_path):
    import mlflow

    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    procs = [  # four processes of their own (tests/zygote.py), started within milliseconds of each other
        start_cli(
            tmp_path,
            "data.n_samples=256",
            "trainer.max_epochs=1",
            f"logger.run_name=first-{i}",
            f"hydra.run.dir={tmp_path}/out-{i}",
            stderr=subprocess.STDOUT,
        )
        for i in range(4)
    ]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:]
    runs = runs_of(mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db"), "seqlab")
    assert sorted(r.info.run_name for r in runs) == [f"first-{i}" for i in range(4)]
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_process_opens_a_local_store_once(tmp_path, monkeypatch):
    # A pack's members and an in-process sweep's jobs share one opened client: the lock, the
    # half-created check and MLflow's schema check (about 0.3 s) are paid once per process.
    from seqlab.store import local

    uri = f"sqlite:///{tmp_path}/once/mlflow.db"
    (tmp_path / "once").mkdir()
    first = local.open_client(uri)

    def no_second_open(db):
        raise AssertionError("the store was opened again")

    monkeypatch.setattr(local, "store_lock", no_second_open)
    assert local.open_client(uri) is first
    other = f"sqlite:///{tmp_path}/other/mlflow.db"
    (tmp_path / "other").mkdir()
    with pytest.raises(AssertionError, match="opened again"):
        local.open_client(other)  # another store is opened as before


def test_a_sqlite_store_on_a_network_filesystem_is_refused_in_one_line(
    tmp_path, compose_cfg, monkeypatch
):
    # Issue 34, point 7: SQLite's locking over NFS (and CIFS, Lustre, GPFS) is unreliable; compute nodes
    # sharing a store there corrupt it. The mount table says which filesystem the store is on (here a
    # mount table of the test's, since no NFS server can be started here).
    import seqlab.store.local as local
    from seqlab import SeqlabError
    from seqlab.train import train

    mounts = tmp_path / "mounts"
    mounts.write_text(
        f"/dev/vda / ext4 rw 0 0\nfileserver:/export/home {tmp_path} nfs4 rw,relatime 0 0\n"
    )
    monkeypatch.setattr(local, "MOUNTS", mounts)
    monkeypatch.setattr(
        local, "_OPENED", {}
    )  # this process has opened the test's store already: as a new process
    assert local.filesystem_of(tmp_path / "mlruns" / "mlflow.db") == "nfs4"
    assert local.filesystem_of(Path("/")) not in local.NETWORK_FILESYSTEMS
    with pytest.raises(SeqlabError) as refused:
        train(compose_cfg(*TINY))
    line = str(refused.value)
    assert (
        line.startswith(
            f"the MLflow store {tmp_path}/mlruns/mlflow.db is on a nfs4 filesystem, where SQLite's file "
            "locking is unreliable"
        )
        and "make server" in line
        and "postgresql://" in line
        and "\n" not in line
    )
    monkeypatch.setattr(local, "MOUNTS", tmp_path / "no-mount-table")  # none to read: not judged
    open_client(f"sqlite:///{tmp_path}/elsewhere/mlflow.db").search_experiments()
