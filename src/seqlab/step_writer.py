"""Per-step metrics written into a local MLflow store by a helper process.

MLflow's SQL store spends a few hundred microseconds of Python (SQLAlchemy's ORM) on each metric
row: for this model at batch 64, a step's three rows (train_loss, train_rmse, lr) cost about as
much CPU as the training step itself. Written from a thread of the training process, that work
also holds the GIL that every PyTorch call of the loop needs back. So the rows go, pickled (a few
microseconds a batch), through a pipe to a child process at a lower priority, which writes them
with MLflow's own client; training never waits for it. At the end of the run the child finishes
what it was given; whatever it did not confirm (it died, or could not write) is written by the
training process itself, so nothing is lost (MLflow ignores a row it already holds).

    python -m seqlab.step_writer TRACKING_URI RUN_ID   # reads pickled row lists on stdin
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional

log = logging.getLogger("seqlab")

Row = tuple[str, float, int, int]  # key, value, timestamp (ms), step
MAX_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics a call


class StepWriter:
    """The training side: `send(rows)` never blocks (a feeder thread writes to the pipe);
    `close()` waits for the child and returns the rows it did not confirm."""

    def __init__(self, tracking_uri: str, run_id: str, nice: int = 10) -> None:
        env = {**os.environ, "SEQLAB_STEP_WRITER_NICE": str(nice)}
        self.errors = tempfile.TemporaryFile()  # what the child says, read if it fails
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seqlab.step_writer", tracking_uri, run_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env,
        )
        self.rows: list[Row] = []  # everything given to the child, until it confirms
        self.confirmed = 0
        self.queue: queue.SimpleQueue[Optional[list[Row]]] = queue.SimpleQueue()
        self.feeder = threading.Thread(target=self._feed, name="seqlab-step-writer", daemon=True)
        self.feeder.start()
        self.reader = threading.Thread(target=self._read, name="seqlab-step-writer-acks", daemon=True)
        self.reader.start()

    def send(self, rows: list[Row]) -> None:
        self.rows.extend(rows)
        self.queue.put(rows)

    def _feed(self) -> None:
        # A full pipe (a slow child) blocks this thread only, and without the GIL.
        while (rows := self.queue.get()) is not None:
            try:
                pickle.dump(rows, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return  # the child is gone: close() finds out what it wrote
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def _read(self) -> None:
        for line in self.proc.stdout:  # one line per batch written, in order
            self.confirmed += int(line)

    def close(self, timeout_s: float = 300.0) -> tuple[list[Row], Optional[str]]:
        """Wait for the child to write everything; returns (rows not confirmed, why) - ([], None)
        when all were written."""
        self.queue.put(None)
        self.feeder.join(timeout_s)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)
        left = self.rows[self.confirmed :]
        why = None
        if left or self.proc.returncode != 0:
            self.errors.seek(0)
            said = self.errors.read().decode(errors="replace").strip().splitlines()
            why = said[-1] if said else f"exit status {self.proc.returncode}"
        self.errors.close()
        return left, why


def _main(tracking_uri: str, run_id: str) -> int:
    # Ctrl-C reaches the terminal's whole process group: the training process decides when to
    # stop, and this one ends when its input does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(int(os.environ.get("SEQLAB_STEP_WRITER_NICE", "10")))
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(tracking_uri)
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while True:
        try:
            rows = pickle.load(stdin)
        except (EOFError, pickle.UnpicklingError):  # the end, or a writer cut off mid-batch
            return 0
        for i in range(0, len(rows), MAX_BATCH):
            chunk = rows[i : i + MAX_BATCH]
            client.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in chunk], synchronous=True)
            # Rows are confirmed in order: the training side re-sends only what follows.
            stdout.write(f"{len(chunk)}\n")
            stdout.flush()


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1], sys.argv[2]))
