"""Per-step metrics written by the helper process (seqlab.tracking.step_writer): every row arrives, also
when the helper dies mid-run, and the run's status comes after its metrics."""

from __future__ import annotations

import pytest
from harness.step_writer import _series

from seqlab.tracking import MlflowTracker


def test_a_run_whose_last_metrics_cannot_be_stored_does_not_end_finished(
    tmp_path, store, monkeypatch
):
    # Issue 24, point 3: the final wait for the run's metrics raised (disk full, the helper gone);
    # the job reports a failure, and the run must not say FINISHED with metrics missing.
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with pytest.raises(OSError, match="No space left on device"):
        with tracker.run("r", {}):
            tracker.log_series(*_series(1, 10))

            def full_disk():
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(tracker.sender, "wait", full_disk)
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert (
        run.data.tags["failure_reason"]
        == "its last metrics could not be stored: [Errno 28] No space left on device"
    )


def test_the_latest_value_holds_across_separate_writes(tmp_path, store):
    # Issue 24, point 7: rows of one key arriving in several transactions. An older step written
    # later must not become the latest value (what the runs table and the UI show); a newer one must.
    from seqlab.tracking.step_writer import SqliteRows

    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer", step_writer="inline"
    )
    with tracker.run("r", {}):
        rows = SqliteRows(f"{tmp_path}/mlruns/mlflow.db", tracker.run_id)
        rows.write([("train_loss", 0.25, 1_000_050, 5)])
        rows.write([("train_loss", 0.75, 1_000_035, 3)])  # an older step, in a later transaction
        assert store.get_run(tracker.run_id).data.metrics["train_loss"] == 0.25
        rows.write([("train_loss", 0.125, 1_000_070, 7)])
        assert store.get_run(tracker.run_id).data.metrics["train_loss"] == 0.125
        rows.con.close()
    assert sorted(m.step for m in store.get_metric_history(tracker.run_id, "train_loss")) == [
        3,
        5,
        7,
    ]


def test_a_store_at_an_unknown_schema_revision_is_written_through_mlflows_client(
    tmp_path, store, capfd
):
    """Issue 33: the plain-SQL path only on the MLflow schema revisions it was tested with (a fresh
    store of the pinned MLflow is one); any other revision through MLflow's client, in one line."""
    import sqlite3

    from seqlab.tracking.step_writer import ClientRows, SqliteRows, open_rows

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    run = store.create_run(store.create_experiment("revisions"))
    assert isinstance(
        open_rows(uri, run.info.run_id), SqliteRows
    )  # the pinned MLflow's revision is known
    with sqlite3.connect(f"{tmp_path}/mlruns/mlflow.db") as con:
        con.execute(
            "UPDATE alembic_version SET version_num = 'f00dfeed0001'"
        )  # as a newer MLflow would leave it
    capfd.readouterr()
    writer = open_rows(uri, run.info.run_id)
    assert isinstance(writer, ClientRows)
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [
        "seqlab.tracking.step_writer: the store's MLflow schema is at revision f00dfeed0001, which this "
        "writer was not tested with: writing through MLflow's client"
    ]
