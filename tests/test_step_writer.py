"""Per-step metrics written by the helper process (seqlab.tracking.step_writer): every row arrives, also
when the helper dies mid-run, and the run's status comes after its metrics."""

from __future__ import annotations

import logging
import math
import time

import pytest

from seqlab.tracking import MlflowTracker


def _series(first: int, n: int) -> tuple[dict[str, list[float]], list[int], list[int]]:
    steps = list(range(first, first + n))
    return (
        {"train_loss": [0.5 / s for s in steps], "lr": [1e-3] * n},
        steps,
        [1_000_000 + s for s in steps],
    )


@pytest.mark.slow
def test_every_row_arrives_through_the_helper_process(tmp_path, store):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with tracker.run("r", {}):
        assert (
            tracker.sender.writer is not None and tracker.sender.writer.proc.poll() is None
        )  # a live child
        assert "mlflow.db" not in " ".join(
            tracker.sender.writer.proc.args
        )  # the address is not shown by ps
        for first in range(1, 3001, 500):
            tracker.log_series(*_series(first, 500))
        deadline = time.monotonic() + 60
        while (
            tracker.sender.writer.rows and time.monotonic() < deadline
        ):  # confirmed rows are let go
            time.sleep(0.05)
            tracker.sender.writer.send(
                []
            )  # what the full pipe did not take goes with the next send
        assert tracker.sender.writer.rows == []
        proc = tracker.sender.writer.proc
    assert proc.returncode == 0
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    history = store.get_metric_history(tracker.run_id, "train_loss")
    assert [m.step for m in history] == list(range(1, 3001))
    assert [m.value for m in history] == [0.5 / s for s in range(1, 3001)]
    assert len(store.get_metric_history(tracker.run_id, "lr")) == 3000
    assert [s for s, _ in tracker.history["train_loss"]] == list(
        range(1, 3001)
    )  # kept for the plot too


@pytest.mark.slow
@pytest.mark.parametrize("path", ["sqlite", "client"])
def test_odd_values_and_the_latest_value_are_stored_as_mlflow_stores_them(
    tmp_path, store, monkeypatch, path
):
    """NaN, infinities, a value logged twice, steps out of order: the same records through the
    plain-SQL path as through MLflow's own client."""
    if path == "client":
        monkeypatch.setenv("SEQLAB_STEP_WRITER_CLIENT", "1")
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    values = [0.5, float("nan"), float("inf"), -float("inf"), 0.25]
    with tracker.run("r", {}):
        tracker.log_series({"train_loss": values}, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
        tracker.log_series(
            {"train_loss": [0.25, 0.75]}, [5, 3], [50, 35]
        )  # a repeat, and an older step
        tracker.log_metrics({"val_rmse": 0.3}, step=5)
    history = sorted(
        store.get_metric_history(tracker.run_id, "train_loss"), key=lambda m: (m.step, m.timestamp)
    )
    assert [(m.step, m.timestamp) for m in history] == [
        (1, 10),
        (2, 20),
        (3, 30),
        (3, 35),
        (4, 40),
        (5, 50),
    ]
    got = [m.value for m in history]
    assert (
        got[0] == 0.5
        and math.isnan(got[1])
        and got[2] > 1e308
        and got[4] < -1e308
        and got[3] == 0.75
    )
    run = store.get_run(tracker.run_id)
    assert (
        run.data.metrics["train_loss"] == 0.25
    )  # the latest step's value, as the runs table shows it
    assert run.data.metrics["val_rmse"] == 0.3


@pytest.mark.slow
def test_inline_writes_the_same_rows_without_a_helper(tmp_path, store):
    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer", step_writer="inline"
    )
    with tracker.run("r", {}):
        assert tracker.sender.writer is None
        tracker.log_series(*_series(1, 50))
    assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(
        range(1, 51)
    )


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


# Issue 24, point 2: a helper that dies or stalls is found at once, and nothing waits on it forever.
@pytest.mark.slow
def test_a_helper_that_dies_loses_nothing_and_is_replaced_at_the_next_send(tmp_path, store, caplog):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        tracker.log_series(*_series(1, 100))
        tracker.sender.writer.proc.kill()
        tracker.sender.writer.proc.wait()
        tracker.log_series(*_series(101, 100))
        # Taken over at that send, said in one line: what the helper had not confirmed is in the
        # store now (not kept in memory until the end, where a kill -9 of the trainer lost it).
        assert tracker.sender.writer is None
        assert caplog.text.count("the step writer stopped") == 1
        assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")][
            :100
        ] == list(range(1, 101))
        tracker.log_series(*_series(201, 10))
        tracker.sync_metrics()
        assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(
            range(1, 211)
        )
    assert "the step writer stopped" in caplog.text and "written from here" in caplog.text
    assert store.get_run(tracker.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_closing_a_stopped_helper_ends_within_its_deadline(tmp_path, store):
    import os
    import signal

    from seqlab.tracking.step_writer import StepWriter

    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer", step_writer="inline"
    )
    with tracker.run("r", {}):
        writer = StepWriter(f"sqlite:///{tmp_path}/mlruns/mlflow.db", tracker.run_id)
        os.kill(writer.proc.pid, signal.SIGSTOP)  # it reads nothing from here: the pipe fills
        rows = [("train_loss", 0.5, 1_000_000 + s, s) for s in range(1, 200_001)]
        for i in range(0, len(rows), 1000):
            writer.send(rows[i : i + 1000])
        assert writer.unwritten  # more than the pipe took
        started = time.monotonic()
        left, why = writer.close(timeout_s=2)
        assert time.monotonic() - started < 10
        assert (
            len(left) == len(rows) and why is not None
        )  # every row handed back, to be written from here


@pytest.mark.slow
def test_a_checkpoint_is_published_only_after_the_steps_before_it_are_stored(
    tmp_path, store, monkeypatch
):
    # A stalled helper: its rows would be lost by a kill, while resume= continues after the
    # checkpoint: a permanent gap. Publishing waits for them, and takes over from a stalled helper.
    import os
    import signal

    from seqlab.resume import points

    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    checkpoint = tmp_path / "interrupted.ckpt"
    checkpoint.write_bytes(b"state")
    monkeypatch.setattr(
        tracker, "sync_metrics", lambda timeout_s=2.0, f=tracker.sync_metrics: f(timeout_s)
    )
    with tracker.run("r", {}):
        os.kill(tracker.sender.writer.proc.pid, signal.SIGSTOP)
        tracker.log_series(*_series(1, 500))
        points.publish_resume_point(tracker, checkpoint, 500)
        assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(
            range(1, 501)
        )
        assert store.get_run(tracker.run_id).data.tags[points.STOPPED_AT] == "500"


@pytest.mark.slow
def test_a_helper_slower_than_training_never_holds_unbounded_memory(
    tmp_path, store, monkeypatch, caplog
):
    # A stopped helper stands for one far slower than training: past the cap, training waits for
    # it (here: not at all) and then writes in its place; what it held is stored, not kept.
    import os
    import signal

    from seqlab.tracking import senders

    monkeypatch.setattr(senders, "MAX_UNCONFIRMED_ROWS", 1_000)
    monkeypatch.setattr(senders, "SLOW_WRITER_WAIT_S", 0.5)
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        os.kill(tracker.sender.writer.proc.pid, signal.SIGSTOP)
        tracker.log_series(*_series(1, 300))  # 600 rows: under the cap, kept for the helper
        assert tracker.sender.writer is not None
        tracker.log_series(*_series(301, 300))  # 1,200: over it
        assert tracker.sender.writer is None and "the step writer stopped" in caplog.text
        tracker.sync_metrics()
        assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(
            range(1, 601)
        )


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
