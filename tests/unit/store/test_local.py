"""Issue 15, point 1: simultaneous first runs. Processes that open a new local store at once all
succeed (one creates it under a file lock, the others wait), and a store left half-created is
named in one line with the fix, never a traceback."""

from __future__ import annotations

import pytest
from harness.store import _sql

from seqlab.store.local import StoreError, half_created, lock_path, open_client, store_lock


def test_a_half_created_store_is_told_apart_from_a_new_or_complete_one(tmp_path, store):
    db = tmp_path / "mlruns" / "mlflow.db"
    assert half_created(tmp_path / "none.db") is None  # new
    (tmp_path / "empty.db").write_bytes(b"")
    assert half_created(tmp_path / "empty.db") is None  # MLflow makes the tables
    assert half_created(db) is None  # complete

    _sql(db, "CREATE TABLE _alembic_tmp_experiments (x INTEGER)")  # what racing first runs left
    assert half_created(db) == (
        f"the MLflow store {db} was left half-created by an interrupted set-up (an older seqlab, or runs that "
        f"created it at the same moment): table _alembic_tmp_experiments is a leftover of a migration; it holds "
        f"no runs: delete it (rm {db}) and run again; the next run creates it afresh"
    )

    store.create_run(store.create_experiment("kept"))
    assert (
        f"it holds 1 run(s): keep a copy of it, then drop the leftover (sqlite3 {db} 'DROP TABLE "
        f"_alembic_tmp_experiments') and run: mlflow db upgrade sqlite:///{db}" in half_created(db)
    )

    _sql(db, "DROP TABLE _alembic_tmp_experiments", "DELETE FROM alembic_version")
    assert "it has no schema version; it holds 1 run(s)" in half_created(db)

    (tmp_path / "notes.db").write_text("not a database, but a long enough text " * 100)
    assert half_created(tmp_path / "notes.db").startswith(
        f"{tmp_path / 'notes.db'} is not an MLflow store"
    )


def test_a_store_locked_too_long_is_one_line(tmp_path):
    db = tmp_path / "mlruns" / "mlflow.db"
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    with store_lock(db):  # another holder: flock excludes every other open of the lock file
        with pytest.raises(
            StoreError, match=r"has been locked by another process for 300 s \(mlflow.db.lock\)"
        ):
            with store_lock(db, clock=lambda: clock[0], sleep=sleep):
                pass
    with store_lock(db, clock=lambda: clock[0], sleep=sleep):  # released: taken at once
        pass
    assert lock_path(db).exists()


def test_open_client_refuses_a_half_created_store_without_touching_it(tmp_path):
    db = tmp_path / "mlruns" / "mlflow.db"
    _sql(db, "CREATE TABLE _alembic_tmp_experiments (x INTEGER)")
    before = db.read_bytes()
    with pytest.raises(StoreError, match="half-created"):
        open_client(f"sqlite:///{db}")
    assert db.read_bytes() == before
