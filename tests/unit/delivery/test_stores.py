"""delivery.stores: rows into a store as MLflow's own store holds them."""

from __future__ import annotations

from seqlab.tracking import MlflowTracker


def test_the_latest_value_holds_across_separate_writes(tmp_path, store):
    # Issue 24, point 7: rows of one key arriving in several transactions. An older step written
    # later must not become the latest value (what the runs table and the UI show); a newer one must.
    from seqlab.delivery.stores import SqliteRows

    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with tracker.run("r", {}):
        rows = SqliteRows(f"{tmp_path}/mlruns/mlflow.db")
        rows.write(tracker.run_id, [("train_loss", 0.25, 1_000_050, 5)])
        # an older step, in a later transaction
        rows.write(tracker.run_id, [("train_loss", 0.75, 1_000_035, 3)])
        assert store.get_run(tracker.run_id).data.metrics["train_loss"] == 0.25
        rows.write(tracker.run_id, [("train_loss", 0.125, 1_000_070, 7)])
        assert store.get_run(tracker.run_id).data.metrics["train_loss"] == 0.125
        rows.con.close()
    steps = sorted(m.step for m in store.get_metric_history(tracker.run_id, "train_loss"))
    assert steps == [3, 5, 7]


def test_a_store_at_an_unknown_schema_revision_is_written_through_mlflows_client(
    tmp_path, store, caplog
):
    """Issue 33: the plain-SQL path only on the MLflow schema revisions it was tested with (a fresh
    store of the pinned MLflow is one); any other revision through MLflow's client, in one line."""
    import sqlite3

    from seqlab.delivery.stores import ClientRows, SqliteRows, open_rows

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    run = store.create_run(store.create_experiment("revisions"))
    assert isinstance(open_rows(uri), SqliteRows)  # the pinned MLflow's revision is known
    with sqlite3.connect(f"{tmp_path}/mlruns/mlflow.db") as con:
        # as a newer MLflow would leave it
        con.execute("UPDATE alembic_version SET version_num = 'f00dfeed0001'")
    caplog.clear()
    writer = open_rows(uri)
    assert isinstance(writer, ClientRows)
    assert [r.getMessage() for r in caplog.records] == [
        "delivery  the store's MLflow schema is at revision f00dfeed0001, which this "
        "writer was not tested with: writing through MLflow's client"
    ]
    writer.write(
        run.info.run_id, [("train_loss", 0.5, 1_000_001, 1), ("train_loss", 0.25, 1_000_002, 2)]
    )
    history = store.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
