"""Metric rows into a store, as MLflow's own stores would hold them: `open_rows(uri)`.

MLflow's SQL store spends a few hundred microseconds of Python (SQLAlchemy's ORM) on each metric
row: for this model at batch 64, a step's three rows (train_loss, train_rmse, lr) cost about as
much CPU as the training step itself, and MLflow has no supported bulk path (mlflow#3010). So a
local SQLite store's two metric tables are written with plain SQL, as MLflow's store would, where
the store is at a schema revision this was tested with and the tables have the columns expected
(both checked when it opens); any other store (a server, PostgreSQL, another revision) goes
through MLflow's `log_batch`, 1,000 rows a call. The delivery process (delivery.helper) uses these,
and so does every replay of a journal (delivery.journal.deliver_journal)."""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import urllib.parse
from typing import Any, Callable, Optional

Row = tuple[str, float, int, int]  # key, value, timestamp (ms), step
MAX_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics a call

log = logging.getLogger("seqlab")


# The two tables MLflow's SQL store keeps metrics in (unchanged from MLflow 1.x to 3.17): a row
# per value, and each key's latest value (what the runs table shows).
METRICS_COLUMNS = {"key", "value", "timestamp", "run_uuid", "step", "is_nan"}
# The MLflow schema revisions (alembic_version) whose metric tables this writer was tested with: the
# pinned MLflow's (requirements.lock). MLflow changes its tables in minor releases (an index on
# metrics in mlflow#20928, a runs.status constraint in #24890): a store at any other revision is
# written through MLflow's own client (tests/unit/delivery/test_stores.py fails on a new pin until it is checked).
KNOWN_REVISIONS = {"dc11669786a5"}  # MLflow 3.17


class SqliteRows:
    """Rows straight into a local SQLite store, as MLflow's SQL store writes them: 20-50 times
    less CPU than its ORM, whose per-row cost this whole module exists for. Used only where the
    store is at a schema revision it was tested with and its two tables have exactly the columns
    above (both checked on open); anything else goes through MLflow's client."""

    def __init__(self, path: str) -> None:
        # mode=rw: a store that is not there is an error (retried), never an empty file made here
        # for MLflow to find; timeout: it waits while MLflow itself writes.
        self.con = sqlite3.connect(
            f"file:{urllib.parse.quote(path)}?mode=rw", uri=True, timeout=120
        )
        revision = self.revision()
        if revision not in KNOWN_REVISIONS:
            self.con.close()
            raise LookupError(
                f"the store's MLflow schema is at revision {revision}, which this writer was not tested with"
            )
        for table in ("metrics", "latest_metrics"):
            columns = {row[1] for row in self.con.execute(f"PRAGMA table_info({table})")}
            if columns != METRICS_COLUMNS:
                self.con.close()
                raise LookupError(f"{table} has columns {sorted(columns)}")

    def revision(self) -> Optional[str]:
        try:
            (found,) = self.con.execute("SELECT version_num FROM alembic_version").fetchone() or (
                None,
            )
        except Exception:  # noqa: BLE001 - sqlite3.OperationalError: no such table (not an MLflow store)
            return None
        return found

    def write(self, run_id: str, rows: list[Row]) -> None:
        values = [(k, *_sanitized(v), ts, run_id, step) for k, v, ts, step in rows]
        latest: dict[str, tuple] = {}
        for row in values:  # per key, the newest by (step, timestamp, value), as MLflow decides
            key, value, is_nan, ts, _, step = row
            if key not in latest or (step, ts, value) > (
                latest[key][5],
                latest[key][3],
                latest[key][1],
            ):
                latest[key] = row
        with self.con:  # one transaction
            # MLflow ignores a value it already holds (same key, step, time, value): so does this.
            self.con.executemany(
                "INSERT OR IGNORE INTO metrics (key, value, is_nan, timestamp, run_uuid, step) VALUES (?, ?, ?, ?, ?, ?)",
                values,
            )
            self.con.executemany(
                "INSERT INTO latest_metrics (key, value, is_nan, timestamp, run_uuid, step) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value, is_nan = excluded.is_nan, "
                "timestamp = excluded.timestamp, step = excluded.step "
                "WHERE (excluded.step, excluded.timestamp, excluded.value) > (step, timestamp, value)",
                list(latest.values()),
            )


def _sanitized(value: float) -> tuple[float, int]:
    """As MLflow stores them: NaN as 0 with is_nan set, infinities as the largest finite floats."""
    if math.isnan(value):
        return 0.0, 1
    if math.isinf(value):
        return (1.7976931348623157e308 if value > 0 else -1.7976931348623157e308), 0
    return value, 0


class ClientRows:
    """Rows through MLflow's client: any store, any MLflow version."""

    def __init__(self, tracking_uri: str) -> None:
        import mlflow  # MLflow: only where SQL cannot take the rows (the helper starts without it)

        self.client = mlflow.MlflowClient(tracking_uri)

    def write(self, run_id: str, rows: list[Row]) -> None:
        from mlflow.entities import Metric  # as mlflow above

        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, ts, step) for k, v, ts, step in rows],
            synchronous=True,
        )


def open_rows(tracking_uri: str, say: Callable[[str], None] = log.warning) -> Any:
    """Where `tracking_uri`'s rows go: by SQL into a known local SQLite store, else MLflow's
    client (SEQLAB_DELIVERY_CLIENT=1: always the client, as a test compares the two); `say`
    takes the one line that says why a SQLite store is not written by SQL."""
    if tracking_uri.startswith("sqlite:///") and os.environ.get("SEQLAB_DELIVERY_CLIENT") != "1":
        try:
            return SqliteRows(tracking_uri[len("sqlite:///") :])
        except LookupError as error:  # another MLflow schema: its own client knows it
            say(f"delivery  {error}: writing through MLflow's client")
    return ClientRows(tracking_uri)


def transient(error: BaseException) -> bool:
    """A failure worth retrying: no answer, a timeout, a locked database or a server-side error
    (5xx, 429), as opposed to a request the store refused (4xx), which would fail again."""
    import requests  # as MLflow: only where rows go through its client (the helper starts without)
    from mlflow.exceptions import MlflowException  # as requests

    if isinstance(
        error,
        (
            requests.RequestException,
            ConnectionError,
            TimeoutError,
            OSError,
            sqlite3.OperationalError,
        ),
    ):
        return True
    if isinstance(error, MlflowException):
        status = error.get_http_status_code()
        return status >= 500 or status == 429
    return False
