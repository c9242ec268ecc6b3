"""A run's metrics written into a local MLflow store by a helper process.

MLflow's SQL store spends a few hundred microseconds of Python (SQLAlchemy's ORM) on each metric
row: for this model at batch 64, a step's three rows (train_loss, train_rmse, lr) cost about as
much CPU as the training step itself. Written from a thread of the training process, that work
also holds the GIL that every PyTorch call of the loop needs back. So the rows go, pickled (a few
microseconds a batch), through a pipe to a child process at a lower priority; training never
waits for it. The child writes a SQLite store's two metric tables with plain SQL, as MLflow's
store would (checked against its schema revision and their columns when it opens; any other
store or schema goes through MLflow's client, with one line). At the end of the run the child finishes what it was given; whatever
it did not confirm (it died, or could not write) is written by the training process itself
through MLflow's client, so nothing is lost (MLflow ignores a row it already holds).

    SEQLAB_STEP_WRITER_URI=... python -m seqlab.tracking.step_writer RUN_ID ACKS_FILE   # pickled row lists on stdin
"""

from __future__ import annotations

import math
import os
import pickle
import re
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Optional

Row = tuple[str, float, int, int]  # key, value, timestamp (ms), step
MAX_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics a call
MIN_WRITE_INTERVAL_S = 0.2  # while rows keep coming, at most about five transactions a second


class StepWriter:
    """The training side, without threads of its own (they would take the GIL from the loop):
    `send(rows)` writes what the pipe takes without waiting and keeps the rest for the next call;
    `close()` writes what is left, waits for the child and returns the rows it did not confirm."""

    def __init__(self, tracking_uri: str, run_id: str, nice: int = 10) -> None:
        # The store's address goes in the environment, not the command line, which any user of
        # the machine can read with ps (an address may hold a password).
        env = {
            **os.environ,
            "SEQLAB_STEP_WRITER_NICE": str(nice),
            "SEQLAB_STEP_WRITER_URI": tracking_uri,
        }
        self.errors = tempfile.TemporaryFile()  # what the child says, read if it fails
        self.acks = tempfile.NamedTemporaryFile(prefix="seqlab-acks-")  # a line per batch written
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seqlab.tracking.step_writer", run_id, self.acks.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self.errors,
            env=env,
        )
        self.fd = self.proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        self.acks_seen = open(self.acks.name)
        self.acks_partial = ""  # a line the child has not finished writing
        self.rows: list[Row] = []  # what was given to the child and it has not confirmed yet
        self.unwritten = b""
        self.broken = False

    def send(self, rows: list[Row]) -> None:
        self._drop_confirmed()  # so a long run does not keep every row it ever sent
        self.rows.extend(rows)
        self.unwritten += pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
        self._write()

    def _drop_confirmed(self) -> None:
        *lines, self.acks_partial = (self.acks_partial + self.acks_seen.read()).split("\n")
        confirmed = sum(int(line) for line in lines if line)
        del self.rows[:confirmed]  # confirmed in order: always the oldest

    def _write(self) -> None:
        while self.unwritten and not self.broken:
            try:
                n = os.write(self.fd, self.unwritten)
            except BlockingIOError:  # the pipe is full: the rest goes with the next call
                return
            except OSError:  # the child is gone: close() finds out what it wrote
                self.broken = True
                return
            self.unwritten = self.unwritten[n:]

    def alive(self) -> bool:
        """The child still takes rows (a dead one is found by the next send, not at the end)."""
        return not self.broken and self.proc.poll() is None

    def drain(self, timeout_s: float) -> bool:
        """Every row sent so far written and confirmed by the child; False if it is gone or has
        not done so within timeout_s (stopped, or stalled on a locked store)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._write()
            self._drop_confirmed()
            if not self.rows and not self.unwritten:
                return True
            if not self.alive() or time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def close(self, timeout_s: float = 300.0) -> tuple[list[Row], Optional[str]]:
        """Wait (at most timeout_s: a stopped or stalled child is killed then) for the child to
        write everything; returns (rows not confirmed, why) - ([], None) when all were written."""
        deadline = time.monotonic() + timeout_s
        while self.unwritten and self.alive() and time.monotonic() < deadline:
            self._write()  # never a blocking write: a child that stopped reading would hold it forever
            if self.unwritten:
                select.select([], [self.fd], [], 0.1)
        if self.unwritten:
            self.proc.kill()  # what it was not given is returned below, with what it did not confirm
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drop_confirmed()
        left = self.rows
        why = None
        if left or self.proc.returncode != 0:
            self.errors.seek(0)
            said = self.errors.read().decode(errors="replace").strip().splitlines()
            # As the command line, the message keeps no password an address held.
            why = (
                re.sub(r"//[^/@\s]+@", "//***@", said[-1])
                if said
                else f"exit status {self.proc.returncode}"
            )
        self.errors.close()
        self.acks_seen.close()
        self.acks.close()
        return left, why


# The two tables MLflow's SQL store keeps metrics in (unchanged from MLflow 1.x to 3.17): a row
# per value, and each key's latest value (what the runs table shows).
METRICS_COLUMNS = {"key", "value", "timestamp", "run_uuid", "step", "is_nan"}
# The MLflow schema revisions (alembic_version) whose metric tables this writer was tested with: the
# pinned MLflow's (requirements.lock). MLflow changes its tables in minor releases (an index on
# metrics in mlflow#20928, a runs.status constraint in #24890): a store at any other revision is
# written through MLflow's own client (tests/unit/tracking/test_step_writer.py fails on a new pin until it is checked).
KNOWN_REVISIONS = {"dc11669786a5"}  # MLflow 3.17


class SqliteRows:
    """Rows straight into a local SQLite store, as MLflow's SQL store writes them: 20-50 times
    less CPU than its ORM, whose per-row cost this whole module exists for. Used only where the
    store is at a schema revision it was tested with and its two tables have exactly the columns
    above (both checked on open); anything else goes through MLflow's client."""

    def __init__(self, path: str, run_id: str) -> None:

        self.run_id = run_id
        self.con = sqlite3.connect(path, timeout=120)  # waits while MLflow itself writes
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

    def write(self, rows: list[Row]) -> None:
        values = [(k, *_sanitized(v), ts, self.run_id, step) for k, v, ts, step in rows]
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

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        import mlflow  # MLflow: only where SQL cannot take the rows (the helper starts without it)

        self.client, self.run_id = mlflow.MlflowClient(tracking_uri), run_id

    def write(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric  # as mlflow above

        self.client.log_batch(
            self.run_id,
            metrics=[Metric(k, v, ts, step) for k, v, ts, step in rows],
            synchronous=True,
        )


def open_rows(tracking_uri: str, run_id: str):
    if tracking_uri.startswith("sqlite:///") and os.environ.get("SEQLAB_STEP_WRITER_CLIENT") != "1":
        try:
            return SqliteRows(tracking_uri[len("sqlite:///") :], run_id)
        except LookupError as error:  # another MLflow schema: its own client knows it
            print(
                f"seqlab.tracking.step_writer: {error}: writing through MLflow's client",
                file=sys.stderr,
            )
    return ClientRows(tracking_uri, run_id)


def _main(run_id: str, acks_path: str) -> int:
    tracking_uri = os.environ["SEQLAB_STEP_WRITER_URI"]
    # Ctrl-C reaches the terminal's whole process group, and a scheduler's SIGTERM every process
    # of the job (SLURM's requeue and scancel, docker stop): the training process decides when to
    # stop and sends its last rows then; this one ends when its input does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(int(os.environ.get("SEQLAB_STEP_WRITER_NICE", "10")))
    writer = open_rows(tracking_uri, run_id)
    stdin = sys.stdin.buffer
    acks = open(acks_path, "a")
    rows: list[Row] = []
    last_write = 0.0
    while True:
        try:
            rows += pickle.load(stdin)
            more = True
        except (EOFError, pickle.UnpicklingError):  # the end, or a writer cut off mid-batch
            more = False
        # A run that sends many times a second (tiny epochs) is written a few times a second: each
        # transaction locks the store, and other processes (compare, the UI, other runs) need it too.
        wait = MIN_WRITE_INTERVAL_S - (time.monotonic() - last_write)
        if more and wait > 0 and select.select([stdin], [], [], wait)[0]:
            continue  # more is coming: it joins this write
        for i in range(0, len(rows), MAX_BATCH):
            chunk = rows[i : i + MAX_BATCH]
            writer.write(chunk)
            # Rows are confirmed in order: the training side re-sends only what follows.
            acks.write(f"{len(chunk)}\n")
            acks.flush()
        rows, last_write = [], time.monotonic()
        if not more:
            return 0


if __name__ == "__main__":
    raise SystemExit(_main(*sys.argv[1:3]))
