"""How a run's records reach the store. One interface, three ways:

- `DirectSender`: a local store (or `synchronous`): MLflow's client, and while the run is open the
  metrics go through the step-writer process (seqlab.tracking.step_writer) so that no ORM write runs in
  the training process.
- `OutboxSender`: a tracking server, which may go away mid-run: writes wait in the outbox
  (seqlab.tracking.outbox); at the end the run waits up to `outage_wait_s` for it, else the whole run is
  copied to the fallback store.
- `NullSender`: processes 1..N-1 of a DDP job: process 0 owns the job's one run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import mlflow
from mlflow.entities import Metric, Param, RunTag

from seqlab import one_line
from seqlab.resume.journal import MetricJournal
from seqlab.resume.safe_writes import is_write_failure, write_failed
from seqlab.secrets import mask_text, masked_copy
from seqlab.tracking.outbox import Outbox, transient
from seqlab.tracking.step_writer import StepWriter

log = logging.getLogger("seqlab")

MAX_BATCH = 1000  # MLflow's log_batch accepts at most 1000 metrics and 100 params per call
MAX_PARAMS = 100
# How long a resume point waits for a server's backlog before the rest goes with the checkpoint.
OUTBOX_SYNC_S = 2.0


def _upload(
    client: mlflow.MlflowClient, run_id: str, path: Path, artifact_path: Optional[str]
) -> None:
    if not path.exists():
        return

    try:
        with masked_copy(path) as path:  # Hydra's files and train.log quote the command line
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path)
            else:
                client.log_artifact(run_id, str(path), artifact_path)
    except (
        OSError
    ) as error:  # a full disk or an unwritable artifact folder: one line naming the path
        if not is_write_failure(error):
            raise
        raise write_failed(error.filename or path, error) from None


class NullSender:
    def wait(self) -> None:
        pass

    def sync(self, timeout_s: float, idle: bool = False) -> None:
        pass

    def unsent(self) -> list[Metric]:
        return []

    def tags_now(self, tags: list[RunTag]) -> None:
        pass

    def params(self, params: list[Param]) -> None:
        pass

    def tags(self, tags: list[RunTag]) -> None:
        pass

    def metrics(self, metrics: list[Metric]) -> None:
        pass

    def artifact(self, path: Path, artifact_path: Optional[str]) -> None:
        pass

    def end(self, status: str, reason: Optional[str]) -> None:
        pass


# A step writer found dead or stalled gets this long to say what it wrote before it is killed.
TAKE_OVER_WAIT_S = 5.0
# Rows a live step writer may hold unconfirmed (about 100 bytes each, kept twice until the pipe
# takes them): past this, training waits for it (SLOW_WRITER_WAIT_S) or writes in its place, so a
# helper slower than training (a store on a slow disk) costs time, never unbounded memory.
MAX_UNCONFIRMED_ROWS = 500_000
SLOW_WRITER_WAIT_S = 30.0


class DirectSender:
    def __init__(
        self, client: mlflow.MlflowClient, run_id: str, step_writer: str, synchronous: bool
    ) -> None:
        self.client, self.run_id, self.synchronous = client, run_id, synchronous
        self.pending: list[Any] = []  # MLflow's background writes, waited for at the end
        # After wait() (the run's metrics stored for its models), the few metrics left (the last
        # system samples) are written at once: MLflow's background writes are waited for in
        # batches (1 s at a run's end, measured)
        self.waited = False
        self.writer = None
        if step_writer == "process":
            self.writer = StepWriter(client.tracking_uri, run_id)

    def params(self, params: list[Param]) -> None:
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS])

    def tags(self, tags: list[RunTag]) -> None:
        self.client.log_batch(self.run_id, tags=tags)

    tags_now = tags

    def unsent(self) -> list[Metric]:
        """The metrics sent that the store does not hold yet (after sync: none, but for a
        writer that has just died)."""
        return (
            [Metric(k, v, ts, step) for k, v, ts, step in self.writer.rows]
            if self.writer is not None
            else []
        )

    def metrics(self, metrics: list[Metric]) -> None:
        if self.writer is not None and not self.writer.alive():
            self._close_writer(
                TAKE_OVER_WAIT_S
            )  # found at once: from here this process writes, nothing piles up
        if (
            self.writer is not None
        ):  # epoch metrics too: no MLflow write in this process while training
            self.writer.send([(m.key, m.value, m.timestamp, m.step) for m in metrics])
            if len(self.writer.rows) > MAX_UNCONFIRMED_ROWS and not self.writer.drain(
                SLOW_WRITER_WAIT_S
            ):
                self._close_writer(TAKE_OVER_WAIT_S)
            return
        self._log(metrics, self.synchronous or self.waited)

    def _log(self, metrics: list[Metric], synchronous: bool) -> None:
        for i in range(0, len(metrics), MAX_BATCH):
            operation = self.client.log_batch(
                self.run_id, metrics=metrics[i : i + MAX_BATCH], synchronous=synchronous
            )
            if operation is not None:
                self.pending.append(operation)

    def artifact(self, path: Path, artifact_path: Optional[str]) -> None:
        _upload(self.client, self.run_id, path, artifact_path)

    def _close_writer(self, timeout_s: float = 300.0) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        left, why = writer.close(timeout_s)
        if left:
            log.warning(
                "tracking  the step writer stopped (%s): its last %d metric values are written from here",
                why,
                len(left),
            )
            self._log(
                [Metric(k, v, ts, step) for k, v, ts, step in left], synchronous=True
            )  # stored before anything else

    def sync(self, timeout_s: float, idle: bool = False) -> None:
        """Every metric sent so far is stored when this returns, the step writer kept: before
        something that depends on them is published (a checkpoint that resume= continues after).
        A writer that does not manage it in timeout_s is replaced by this process's own writes."""
        if self.writer is not None and not self.writer.drain(timeout_s):
            self._close_writer(TAKE_OVER_WAIT_S)
        pending, self.pending = self.pending, []
        for operation in pending:
            operation.wait()

    def wait(self) -> None:
        """Every metric sent so far is stored when this returns (the step writer is closed: later
        metrics go through MLflow's client from this process)."""
        self.waited = True
        self._close_writer()
        pending, self.pending = self.pending, []
        for operation in pending:
            operation.wait()

    def end(self, status: str, reason: Optional[str]) -> None:
        try:
            self.wait()
        except BaseException as error:
            # Metrics that were never stored make no FINISHED run: the run says what the job says.
            if status == "FINISHED":
                status, reason = (
                    "FAILED",
                    f"its last metrics could not be stored: {one_line(error)}",
                )
            raise
        finally:
            if reason:
                self.tags([RunTag("failure_reason", mask_text(reason))])
            self.client.set_terminated(self.run_id, status)


@dataclass
class RunRecord:
    """Everything a run sent to a server, kept for a copy to the fallback store (its metrics on disk)."""

    name: str
    tags: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    metrics: MetricJournal = field(default_factory=MetricJournal)
    artifacts: list[tuple[Path, Optional[str]]] = field(default_factory=list)


class OutboxSender:
    def __init__(
        self,
        client: mlflow.MlflowClient,
        run_id: str,
        record: RunRecord,
        outage_wait_s: float,
        copy_to_fallback: Callable[[RunRecord, str], None],
    ) -> None:
        self.client, self.run_id, self.record = client, run_id, record
        self.outage_wait_s = outage_wait_s
        self.copy_to_fallback = copy_to_fallback
        self.outbox = Outbox(self._send, client.tracking_uri)
        self.unsent_artifacts: list[tuple[Path, Optional[str]]] = []

    def _send(self, item: dict[str, Any]) -> None:
        self.client.log_batch(self.run_id, synchronous=True, **item)
        # In order: the journal's first rows are the ones the server holds (seqlab.resume.journal).
        self.record.metrics.confirm(len(item.get("metrics", ())))

    def wait(self) -> None:
        pass  # the outbox sends in order: what follows is stored after what was sent before

    def sync(self, timeout_s: float, idle: bool = False) -> None:
        """What the outbox holds sent, if the server takes it within a short wait: a server
        slower than training, or away, leaves a backlog that a stop could not wait for (SLURM
        kills a job KillWait after its SIGTERM). What is still here then goes with the checkpoint
        (`unsent`, seqlab.resume.points), and the resumed run sends it first. `idle`: waited for as
        long as the server keeps taking writes (a run's end, which waits for them anyway)."""
        self.outbox.drain(timeout_s if idle else min(timeout_s, OUTBOX_SYNC_S), idle=idle)

    def unsent(self) -> list[Metric]:
        with self.outbox.cond:
            return [m for item in self.outbox.queue for m in item.get("metrics", ())]

    def tags_now(self, tags: list[RunTag]) -> None:
        """Tags that must not wait behind the outbox's backlog (the resume point's); during an
        outage they join the queue."""
        self.record.tags.update({t.key: t.value for t in tags})
        try:
            self.client.log_batch(self.run_id, tags=tags)
        except Exception as error:  # noqa: BLE001 - classified
            if not transient(error):
                raise
            self.outbox.put({"tags": tags})

    def params(self, params: list[Param]) -> None:
        self.record.params.update({p.key: p.value for p in params})
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS])

    def tags(self, tags: list[RunTag]) -> None:
        self.record.tags.update({t.key: t.value for t in tags})
        self.outbox.put({"tags": tags})

    def metrics(self, metrics: list[Metric]) -> None:
        self.record.metrics.extend(metrics)
        for i in range(0, len(metrics), MAX_BATCH):
            self.outbox.put({"metrics": metrics[i : i + MAX_BATCH]})

    def artifact(self, path: Path, artifact_path: Optional[str]) -> None:
        self.record.artifacts.append((path, artifact_path))
        if self.outbox.down_since is not None:  # known to be away: do not wait for it here
            self.unsent_artifacts.append((path, artifact_path))
            return
        try:
            _upload(self.client, self.run_id, path, artifact_path)
        except Exception as error:  # noqa: BLE001
            if not transient(error):
                raise
            self.unsent_artifacts.append((path, artifact_path))  # tried again at the end

    def end(self, status: str, reason: Optional[str]) -> None:
        """Wait (up to outage_wait_s) for the server to take every write, then close the run
        there; if it does not, copy the whole run to the local fallback store."""
        if reason:
            self.tags([RunTag("failure_reason", mask_text(reason))])
        if self.outbox.down_since is not None:
            log.warning(
                "tracking  waiting up to %.0f s for the server at %s to take this run's last metrics",
                self.outage_wait_s,
                self.client.tracking_uri,
            )
        elif len(self.outbox.queue) > 10:
            log.info(
                "tracking  sending the run's last %d batch(es) of metrics: the server is slower than training",
                len(self.outbox.queue),
            )
        try:
            # Given up only after outage_wait_s in which the server took nothing: a slow server is
            # waited for (copying the run elsewhere would leave the server's copy half-written).
            if not self.outbox.drain(self.outage_wait_s, idle=True):
                raise ConnectionError("the tracking server did not come back")
            for path, artifact_path in self.unsent_artifacts:
                try:
                    _upload(self.client, self.run_id, path, artifact_path)
                except Exception as error:  # noqa: BLE001 - the run's status matters more
                    if transient(error):
                        raise
                    log.warning(
                        "tracking  %s was not stored: %s",
                        path.name,
                        " ".join(str(error).split())[:200],
                    )
            self.unsent_artifacts = []
            self.client.set_terminated(self.run_id, status)
        except Exception as error:  # noqa: BLE001
            if not transient(error):
                raise
            self.copy_to_fallback(self.record, status)
        finally:
            self.outbox.close()
            for refused in self.outbox.refused:
                log.warning("tracking  the server refused a write: %s", refused)
        self.record.metrics.discard()  # the run is whole on the server, or in the fallback store
