"""A run's metrics as sent to a tracking server, kept on disk: `MetricJournal`.

Two uses. The run's copy for the fallback store (a server that never comes back) reads them from
disk, so a long run costs about 25 bytes of disk a value and no memory. And, kept in the job's
folder (`journal_paths`, with a count of the rows the server has confirmed, in order),
they survive the process: a job killed outright while the server was away or behind (SIGKILL
after SIGTERM within SLURM's KillWait, `docker stop`, the OOM killer) leaves the rows the server
never got there, and `resume=` (or the requeued job) sends them first (`deliver_journal`). Light
imports only: MLflow loads where rows are made.

The journal is data, never code: one line per batch, `CRC32 JSON\n`, the JSON a list of
[key, value, timestamp, step] rows (issue 33). Its folder may be named by a run anyone who can
write to the store created (the reaper and `resume=` read the run's `paths.output_dir`), so a
journal is read only where it is a plain file this user owns, never through a link; and a torn
last line (a kill mid-write, a full disk) or a line whose checksum fails ends the reading: the
rows before it count."""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from seqlab.resume.safe_writes import is_write_failure, write_failed

log = logging.getLogger("seqlab")


def journal_paths(folder: Path, run_id: str) -> tuple[Path, Path]:
    """The journal of run `run_id` in `folder`, and its count of confirmed rows."""
    return folder / f".seqlab-metrics-{run_id}.journal", folder / f".seqlab-metrics-{run_id}.sent"


class MetricJournal:
    """Rows appended as the run sends them; `confirm(n)` as the server takes them, in order. In
    `folder` (named files that outlive a kill), else an unnamed temporary file."""

    def __init__(self, folder: Optional[Path] = None, run_id: str = "") -> None:
        self.paths = journal_paths(folder, run_id) if folder is not None else None
        if folder is not None:
            folder.mkdir(
                mode=0o700, parents=True, exist_ok=True
            )  # a job's folder: this user's only (secrets.private)
        self.file = (
            os.fdopen(
                os.open(self.paths[0], os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                "w+b",
            )
            if self.paths
            else tempfile.TemporaryFile(prefix="seqlab-metrics-")
        )
        self.sent_fd = (
            os.open(self.paths[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            if self.paths
            else None
        )
        self.count = 0
        self.sent = 0

    def __len__(self) -> int:
        return self.count

    def extend(self, metrics: list[Any]) -> None:
        try:
            self.file.write(_record([[m.key, m.value, m.timestamp, m.step] for m in metrics]))
            self.file.flush()  # into the kernel: a kill of this process loses none of it
        except (
            OSError
        ) as error:  # a full disk or a quota: one line, the run ends KILLED (tracking.lifecycle)
            if not is_write_failure(error):
                raise
            raise write_failed(
                self.paths[0] if self.paths else "the metrics' temporary journal", error
            ) from None
        self.count += len(metrics)

    def confirm(self, n: int) -> None:
        """The server holds n more of the rows, the next in order."""
        self.sent += n
        if self.sent_fd is not None and n:
            os.pwrite(self.sent_fd, f"{self.sent:<20d}".encode(), 0)

    def batches(self, skip: int = 0) -> Iterator[list[Any]]:
        """Everything extended so far, in the order it was sent (but the first `skip` rows)."""
        yield from _read(self.file, skip)
        self.file.seek(0, 2)  # further batches go after the last

    def discard(self) -> None:
        """The run is whole somewhere: the journal is not needed again."""
        self.file.close()
        if self.sent_fd is not None:
            os.close(self.sent_fd)
            self.sent_fd = None
        for path in self.paths or ():
            path.unlink(missing_ok=True)


def _record(rows: list[list[Any]]) -> bytes:
    """One batch as one line: its checksum, then its rows as JSON (NaN and Infinity as JSON's extension writes them)."""
    body = json.dumps(rows, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _rows(file: BinaryIO) -> Iterator[list[Any]]:
    """Each whole batch, in order, up to the first line that is torn or fails its checksum."""
    for line in file:
        if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
            return  # cut off by a kill or a full disk: the rows before it count
        body = line[9:-1]
        try:
            if int(line[:8], 16) != zlib.crc32(body):
                return
            rows = json.loads(body)
        except ValueError:
            return
        yield rows


def _read(file: BinaryIO, skip: int) -> Iterator[list[Any]]:
    from mlflow.entities import Metric  # MLflow: only to replay (every job imports this module)

    file.flush()
    file.seek(0)
    for rows in _rows(file):
        if skip >= len(rows):
            skip -= len(rows)
            continue
        yield [Metric(str(k), float(v), int(ts), int(step)) for k, v, ts, step in rows[skip:]]
        skip = 0


def _open_own(path: Path) -> Optional[BinaryIO]:
    """`path` opened for reading where it is a plain file this user owns (not a link); else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        log.warning("journal   %s is not a file of this user's: not read", path)
        return None
    return os.fdopen(fd, "rb")


def send_metrics(client: Any, run_id: str, metrics: list[Any]) -> None:
    """Metrics a run had not stored, stored now, in MLflow's largest batches."""
    for i in range(0, len(metrics), 1000):  # MLflow's most metrics a call
        client.log_batch(run_id, metrics=metrics[i : i + 1000], synchronous=True)


def deliver_journal(client: Any, run_id: str, folder: Path) -> int:
    """Send what a killed process journaled for `run_id` and its server never confirmed (the
    store keeps a row it already has once); how many rows. The journal is removed once sent."""
    path, sent_path = journal_paths(folder, run_id)
    journal = _open_own(path)
    if journal is None:
        return 0
    sent = 0
    counted = _open_own(sent_path)
    if counted is not None:
        with counted:
            try:
                sent = int(counted.read(64).strip() or 0)
            except ValueError:
                pass
    n = 0
    with journal:
        for batch in _read(journal, sent):
            send_metrics(client, run_id, batch)
            n += len(batch)
    for leftover in (path, sent_path):
        leftover.unlink(missing_ok=True)
    return n
