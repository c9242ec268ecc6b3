"""Per-step metrics written by the helper process (seqlab.tracking.step_writer): every row arrives, also
when the helper dies mid-run, and the run's status comes after its metrics."""

from __future__ import annotations

import logging
import math
import time

import pytest
from harness.step_writer import _series

from seqlab.tracking import MlflowTracker


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


def test_inline_writes_the_same_rows_without_a_helper(tmp_path, store):
    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer"
    )
    with tracker.run("r", {}):
        assert tracker.sender.writer is None
        tracker.log_series(*_series(1, 50))
    assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(
        range(1, 51)
    )


# Issue 24, point 2: a helper that dies or stalls is found at once, and nothing waits on it forever.
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


def test_closing_a_stopped_helper_ends_within_its_deadline(tmp_path, store):
    import os
    import signal

    from seqlab.tracking.step_writer import StepWriter

    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer"
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
