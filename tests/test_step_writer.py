"""Per-step metrics written by the helper process (seqlab.step_writer): every row arrives, also
when the helper dies mid-run, and the run's status comes after its metrics."""

from __future__ import annotations

import logging

from seqlab.tracking import MlflowTracker


def _series(first: int, n: int) -> tuple[dict[str, list[float]], list[int], list[int]]:
    steps = list(range(first, first + n))
    return {"train_loss": [0.5 / s for s in steps], "lr": [1e-3] * n}, steps, [1_000_000 + s for s in steps]


def test_every_row_arrives_through_the_helper_process(tmp_path, store):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with tracker.run("r", {}):
        assert tracker.writer is not None and tracker.writer.proc.poll() is None  # a live child
        for first in range(1, 3001, 500):
            tracker.log_series(*_series(first, 500))
        proc = tracker.writer.proc
    assert proc.returncode == 0
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    history = store.get_metric_history(tracker.run_id, "train_loss")
    assert [m.step for m in history] == list(range(1, 3001))
    assert [m.value for m in history] == [0.5 / s for s in range(1, 3001)]
    assert len(store.get_metric_history(tracker.run_id, "lr")) == 3000
    assert [s for s, _ in tracker.history["train_loss"]] == list(range(1, 3001))  # kept for the plot too


def test_a_helper_that_dies_loses_nothing(tmp_path, store, caplog):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        tracker.log_series(*_series(1, 100))
        tracker.writer.proc.kill()
        tracker.writer.proc.wait()
        tracker.log_series(*_series(101, 100))
    assert "the step writer stopped" in caplog.text and "written from here" in caplog.text
    assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(range(1, 201))
    assert store.get_run(tracker.run_id).info.status == "FINISHED"


def test_inline_writes_the_same_rows_without_a_helper(tmp_path, store):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer", step_writer="inline")
    with tracker.run("r", {}):
        assert tracker.writer is None
        tracker.log_series(*_series(1, 50))
    assert [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")] == list(range(1, 51))
