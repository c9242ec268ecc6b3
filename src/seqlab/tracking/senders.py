"""How a run's records reach the store. One way for every store:

- `JournalSender`: the run's metrics go into its journal on disk and from there, through the
  process's delivery helper, into the store (seqlab.delivery); params, tags and artifacts through
  MLflow's client. A local store whose helper does not deliver in time is written from this
  process; a tracking server that takes nothing for `outage_wait_s` at the run's end leaves the
  journal where it is, and the run waits, RUNNING, for the next command that opens the store.
- `NullSender`: processes 1..N-1 of a DDP job: process 0 owns the job's one run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import mlflow
from mlflow.entities import Metric, Param, RunTag

from seqlab import SeqlabError, one_line
from seqlab.delivery.figures import Curves, DrawnHere
from seqlab.delivery.helper import Delivery
from seqlab.delivery.journal import MetricJournal, end_status_path
from seqlab.delivery.stores import transient
from seqlab.safe_writes import is_write_failure, write_failed
from seqlab.secrets import mask_text, mask_uris, masked_copy

log = logging.getLogger("seqlab")

MAX_PARAMS = 100  # MLflow's log_batch accepts at most 100 params per call
# How long a resume point waits for a server's backlog before the rest goes with the checkpoint.
SERVER_SYNC_S = 2.0
# How long a local store's delivery may confirm nothing before this process writes in its place.
LOCAL_STALL_S = 30.0


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


class Undelivered(SeqlabError):
    """A run whose store took nothing of its journal for outage_wait_s at its end: the journal
    waits in the job's folder, and the run, RUNNING, for the next command that opens the store."""


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

    def curves(self, curves: Curves) -> DrawnHere:
        return DrawnHere(curves)

    def end(self, status: str, reason: Optional[str]) -> None:
        pass


class JournalSender:
    def __init__(
        self,
        client: mlflow.MlflowClient,
        run_id: str,
        journal: MetricJournal,
        server: bool,
        outage_wait_s: float,
        synchronous: bool,
    ) -> None:
        self.client, self.run_id, self.journal = client, run_id, journal
        self.server, self.outage_wait_s, self.synchronous = server, outage_wait_s, synchronous
        self.delivery = Delivery.to(client.tracking_uri, outage_wait_s)
        self.delivery.open(journal)
        self.unsent_tags: list[RunTag] = []  # a server's, while it is away: sent at the end
        self.unsent_artifacts: list[tuple[Path, Optional[str]]] = []

    def params(self, params: list[Param]) -> None:
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS])

    def tags(self, tags: list[RunTag]) -> None:
        if self.server and self.delivery.down:
            self.unsent_tags += tags  # known to be away: do not wait for it here
            return
        try:
            self.client.log_batch(self.run_id, tags=tags)
        except Exception as error:  # noqa: BLE001 - classified
            if not (self.server and transient(error)):
                raise
            self.unsent_tags += tags

    tags_now = tags

    def metrics(self, metrics: list[Metric]) -> None:
        self.journal.extend(metrics)  # on disk: from here the delivery process's
        self.delivery.check()
        if self.synchronous:  # perf=naive: the store holds each write before training goes on
            self.sync(LOCAL_STALL_S)

    def unsent(self) -> list[Metric]:
        """The metrics journaled that the store has not confirmed yet."""
        return [Metric(k, v, ts, step) for k, v, ts, step in self.journal.unsent()]

    def artifact(self, path: Path, artifact_path: Optional[str]) -> None:
        if self.server and self.delivery.down:
            self.unsent_artifacts.append((path, artifact_path))
            return
        try:
            _upload(self.client, self.run_id, path, artifact_path)
        except Exception as error:  # noqa: BLE001
            if not (self.server and transient(error)):
                raise
            self.unsent_artifacts.append((path, artifact_path))  # tried again at the end

    def curves(self, curves: Curves) -> Any:
        """The run's training-curves figure, drawn by the delivery process (delivery.figures)."""
        return self.delivery.draw(curves)

    def sync(self, timeout_s: float, idle: bool = False) -> bool:
        """Every metric journaled so far stored when this returns True. A local store's delivery
        that confirms nothing for timeout_s is replaced by this process's own writes. A server is
        waited for briefly (what it has not taken goes with a checkpoint: `unsent`), or, `idle`,
        as long as it keeps taking rows."""
        if self.server:
            return self.delivery.wait(
                self.journal, timeout_s if idle else min(timeout_s, SERVER_SYNC_S)
            )
        if not self.delivery.wait(self.journal, timeout_s):
            self.delivery.take_over(self.journal)
        return True

    def wait(self) -> None:
        """Every metric sent so far stored (before a logged model links them)."""
        self.sync(self.outage_wait_s if self.server else LOCAL_STALL_S, idle=True)

    def end(self, status: str, reason: Optional[str]) -> None:
        """The run ends only once its journal is delivered. A server that takes nothing for
        outage_wait_s: the journal stays in the job's folder with the status the run ends with,
        and the next command that opens the store (its reaper) delivers both."""
        if self.server and self.delivery.down:
            log.warning(
                "tracking  waiting up to %.0f s for the server at %s to take this run's last metrics",
                self.outage_wait_s,
                mask_uris(self.client.tracking_uri),
            )
        try:
            delivered = self.sync(self.outage_wait_s if self.server else LOCAL_STALL_S, idle=True)
            if delivered:
                self._send_the_rest()
                self._close_run(status, reason)
        except Exception as error:  # noqa: BLE001 - classified
            if not (self.server and transient(error)):
                self.delivery.close(self.journal)
                # Metrics that were never stored make no FINISHED run: it says what the job says.
                if status == "FINISHED":
                    status = "FAILED"
                    reason = f"its last metrics could not be stored: {one_line(error)}"
                self._close_run(status, reason)
                raise
            delivered = False
        self.delivery.close(self.journal)
        if delivered:
            self.journal.discard()  # the run is whole in the store
            return
        left = self.journal.count - self.journal.sent
        end_status_path(self.journal.folder, self.run_id).write_text(status)
        raise Undelivered(
            f"the tracking server at {mask_uris(self.client.tracking_uri)} took nothing for "
            f"{self.outage_wait_s:.0f} s: run {self.run_id} stays RUNNING there, its last {left} metric "
            f"value(s) in {self.journal.paths[0]}; once the server is back, the next command that opens "
            f"it (python train.py, scripts/compare.py) delivers them and ends the run {status}"
        )

    def _close_run(self, status: str, reason: Optional[str]) -> None:
        if reason:
            self.client.log_batch(self.run_id, tags=[RunTag("failure_reason", mask_text(reason))])
        self.client.set_terminated(self.run_id, status)

    def _send_the_rest(self) -> None:
        tags, self.unsent_tags = self.unsent_tags, []
        if tags:
            self.client.log_batch(self.run_id, tags=tags)
        for path, artifact_path in self.unsent_artifacts:
            try:
                _upload(self.client, self.run_id, path, artifact_path)
            except Exception as error:  # noqa: BLE001 - the run's status matters more
                if transient(error):
                    raise
                log.warning("tracking  %s was not stored: %s", path.name, one_line(error)[:200])
        self.unsent_artifacts = []
