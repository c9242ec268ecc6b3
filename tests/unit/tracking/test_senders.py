"""tracking.senders: how a run's records travel."""

from __future__ import annotations

from mlflow.entities import Metric

from seqlab.tracking.senders import DirectSender


class Client:
    """MlflowClient.log_batch as DirectSender calls it: which writes were asked to be synchronous."""

    tracking_uri = "sqlite:///unused.db"

    def __init__(self) -> None:
        self.synchronous: list[bool] = []

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        self.synchronous.append(synchronous)


def test_metrics_after_the_runs_metrics_were_waited_for_are_written_at_once():
    client = Client()
    sender = DirectSender(client, "run", step_writer="off", synchronous=False)
    sender.metrics([Metric("train_loss", 1.0, 0, 1)])  # training: MLflow's background writes
    sender.wait()  # stored for the models
    sender.metrics([Metric("system/cpu_utilization_percentage", 50.0, 0, 3)])  # the last samples
    # Not left to MLflow's background queue, which a run's end then waited a second for.
    assert client.synchronous == [False, True]
