"""tracking.senders: how a run's records travel (its metrics through its journal and the
process's delivery helper, seqlab.delivery), and that a run's status comes after its metrics."""

from __future__ import annotations

import pytest
from harness.delivery import _series

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

            def full_disk(timeout_s, idle=False):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(tracker.sender, "sync", full_disk)
    run = store.get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert (
        run.data.tags["failure_reason"]
        == "its last metrics could not be stored: [Errno 28] No space left on device"
    )


def test_synchronous_metrics_are_in_the_store_when_the_call_returns(tmp_path, store):
    """logger.synchronous=true (perf=naive's baseline): training waits for the store each time."""
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer", synchronous=True)
    with tracker.run("r", {}):
        for first in (1, 11, 21):
            tracker.log_series(*_series(first, 10))
            steps = [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")]
            assert steps == list(range(1, first + 10))
    assert store.get_run(tracker.run_id).info.status == "FINISHED"
