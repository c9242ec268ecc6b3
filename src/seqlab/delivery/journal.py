"""A run's metrics on disk first: `MetricJournal` (the training process appends), `Tail` (whoever
delivers reads on from the last row the store confirmed) and `deliver_journal` (a journal left by
a process that is gone, delivered: resume=, a requeued job, the reaper of dead runs).

Every metric row of a run goes into its journal before anything else happens to it, so training
never waits for the store, and a kill of any process loses nothing the journal holds. The journal
lives in the job's folder (0700), beside a count of the rows its store has confirmed, in order
(`journal_paths`); the delivery process advances the count.

The journal is data, never code: one line per batch, `CRC32 JSON\\n`, the JSON a list of
[key, value, timestamp, step] rows. Its folder may be named by a run anyone who can write to the
store created (the reaper and `resume=` read the run's `paths.output_dir`), so a journal is read
only in a folder this user owns and no one else may write, as a plain file this user owns, never
through a link; and a torn last line (a kill mid-write, a full disk) or a line whose checksum
fails ends the reading: the rows before it count."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Optional

from seqlab.delivery.stores import MAX_BATCH, Row, open_rows
from seqlab.safe_writes import is_write_failure, write_failed

log = logging.getLogger("seqlab")

# How long a deliverer waits for another one to let go of a journal: a killed trainer's helper
# gives a store that does not answer logger.outage_wait_s (60 s) after its trainer's end.
LOCK_WAIT_S = 180.0


def journal_paths(folder: Path, run_id: str) -> tuple[Path, Path]:
    """The journal of run `run_id` in `folder`, and its count of confirmed rows."""
    return folder / f".seqlab-metrics-{run_id}.journal", folder / f".seqlab-metrics-{run_id}.sent"


def end_status_path(folder: Path, run_id: str) -> Path:
    """Where a run whose store did not take its journal in time says the status it ends with."""
    return folder / f".seqlab-metrics-{run_id}.end"


def end_status(folder: Path, run_id: str) -> Optional[str]:
    """The status a run's process meant to end it with, where it left one (see end_status_path)."""
    if not _own_folder(folder):
        return None
    file = _open_own(end_status_path(folder, run_id), os.O_RDONLY)
    if file is None:
        return None
    with file:
        said = file.read(16).decode(errors="replace").strip()
    return said if said in ("FINISHED", "FAILED", "KILLED") else None


class MetricJournal:
    """The training side: rows appended as the run makes them (`extend`), in `folder` (None: a
    private temporary folder, for a run with no job folder); `sent` is what the store confirmed."""

    def __init__(self, folder: Optional[Path], run_id: str) -> None:
        self.temporary = folder is None
        folder = Path(tempfile.mkdtemp(prefix="seqlab-metrics-")) if folder is None else folder
        # A job's folder: this user's only (secrets.private), as the reader checks.
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder, self.run_id = folder, run_id
        self.paths = journal_paths(folder, run_id)
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        self.file = os.fdopen(os.open(self.paths[0], flags, 0o600), "w+b")
        self.sent_fd = os.open(self.paths[1], flags, 0o600)
        self.count = 0

    def extend(self, metrics: list[Any]) -> None:
        if not metrics:
            return
        try:
            self.file.write(_record([[m.key, m.value, m.timestamp, m.step] for m in metrics]))
            self.file.flush()  # into the kernel: a kill of this process loses none of it
        except OSError as error:  # a full disk or a quota: one line, the run ends KILLED
            if not is_write_failure(error):
                raise
            raise write_failed(self.paths[0], error) from None
        self.count += len(metrics)

    @property
    def sent(self) -> int:
        """How many of the rows, the first in order, the store holds (the delivery's count)."""
        return _count(os.pread(self.sent_fd, 64, 0))

    def unsent(self) -> list[Row]:
        """The rows the store has not confirmed yet, in order."""
        with open(self.paths[0], "rb") as file:
            tail = Tail(
                file, self.sent_fd, lock=False
            )  # the helper may hold the lock: reading is safe
            while tail.read():
                pass
            return tail.pending

    def discard(self) -> None:
        """The store holds the whole run: the journal is not needed again."""
        self.file.close()
        os.close(self.sent_fd)
        if self.temporary:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            for path in self.paths:
                path.unlink(missing_ok=True)


class Tail:
    """A journal being delivered, from the first row its count says the store lacks: `read()`
    adds the whole records appended since to `pending`, `confirm(n)` advances the count once the
    store holds the first n of them. A record still being written is read at the next call."""

    def __init__(self, file: BinaryIO, sent_fd: int, lock: bool = True) -> None:
        self.file, self.sent_fd = file, sent_fd
        # One deliverer at a time (a killed trainer's helper still at it, a resume, the reaper):
        # two writers of one row at once break the store's unique key. Held until closed, or the
        # holder's death; the count is read once it is ours. (A reader that delivers nothing,
        # MetricJournal.unsent, takes no lock.)
        if lock:
            _lock(file, LOCK_WAIT_S)
        self.sent = _count(os.pread(sent_fd, 64, 0))
        self.skip = self.sent  # rows already confirmed, met again from the journal's start
        self.offset = 0
        self.pending: list[Row] = []
        self.broken = False  # a record failed its checksum: nothing after it is trusted

    def read(self) -> int:
        """Bytes read (0: nothing whole past the last read)."""
        if self.broken:
            return 0
        start = self.offset
        data = os.pread(self.file.fileno(), 1 << 24, self.offset)  # 16 MB: many seconds of rows
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines(keepends=True):
            batch = _parse(line)
            if batch is None:
                self.broken = True
                break
            self.offset += len(line)
            if self.skip >= len(batch):
                self.skip -= len(batch)
                continue
            # JSON gives back the types written (str, float, int, int): no conversion a row.
            self.pending += map(tuple, batch[self.skip :])
            self.skip = 0
        return self.offset - start

    def rows_waiting(self) -> bool:
        """Whether the journal holds a whole record past what was read."""
        return not self.broken and b"\n" in os.pread(self.file.fileno(), 1 << 16, self.offset)

    def confirm(self, n: int) -> None:
        self.sent += n
        os.pwrite(self.sent_fd, f"{self.sent:<20d}".encode(), 0)

    def close(self) -> None:
        self.file.close()
        os.close(self.sent_fd)


def open_tail(folder: Path, run_id: str) -> Optional[Tail]:
    """The journal of `run_id` in `folder` to deliver, where it is this user's (see the module's
    docstring); None where there is none or it is not."""
    if not _own_folder(folder):
        return None
    path, sent_path = journal_paths(folder, run_id)
    journal = _open_own(path, os.O_RDONLY)
    if journal is None:
        return None
    sent_fd = _open_own_fd(sent_path, os.O_RDWR)
    if sent_fd is None:  # no count: nothing was confirmed
        sent_fd = os.open(sent_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return Tail(journal, sent_fd)


def deliver(tail: Tail, writer: Any, run_id: str) -> int:
    """What `tail` has read and the store lacks, into it through `writer` (delivery.stores), in
    MLflow's largest batches, each confirmed once stored (a failure leaves the rest pending, to be
    tried again); how many rows."""
    n = 0
    while tail.pending:
        chunk = tail.pending[:MAX_BATCH]
        writer.write(run_id, chunk)
        del tail.pending[: len(chunk)]
        tail.confirm(len(chunk))
        n += len(chunk)
    return n


def deliver_all(tail: Tail, writer: Any, run_id: str) -> int:
    """Every whole record of `tail` the store lacks, delivered; how many rows."""
    n = 0
    while True:
        tail.read()
        if not tail.pending:
            return n
        n += deliver(tail, writer, run_id)


def deliver_journal(tracking_uri: str, run_id: str, folder: Path) -> int:
    """What a process that is gone journaled for `run_id` and its store never confirmed, delivered
    now with the delivery process's own code (the store keeps a row it already has once); how many
    rows. The journal is removed once delivered."""
    tail = open_tail(folder, run_id)
    if tail is None:
        return 0
    try:
        n = deliver_all(tail, open_rows(tracking_uri), run_id)
    finally:
        tail.close()
    for leftover in (*journal_paths(folder, run_id), end_status_path(folder, run_id)):
        leftover.unlink(missing_ok=True)
    return n


def _record(rows: list[list[Any]]) -> bytes:
    """One batch as one line: its checksum, then its rows as JSON (NaN and Infinity as JSON's extension writes them)."""
    body = json.dumps(rows, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse(line: bytes) -> Optional[list[Any]]:
    """A whole line's rows; None where it is torn or fails its checksum."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return json.loads(body)
    except ValueError:
        return None


def _lock(file: BinaryIO, wait_s: float) -> None:
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{file.name} is being delivered by another process") from None
            if not said:
                log.info("journal   %s: waiting for the process delivering it", file.name)
                said = True
            time.sleep(0.1)


def _count(data: bytes) -> int:
    try:
        return int(data.strip() or 0)
    except ValueError:
        return 0


def _own_folder(folder: Path) -> bool:
    """A folder this user owns and no one else may write into (not a link)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        log.warning("journal   %s is not a folder of this user's alone: not read", folder)
        return False
    return True


def _open_own_fd(path: Path, flags: int) -> Optional[int]:
    """`path` opened where it is a plain file this user owns (not a link); else None."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        log.warning("journal   %s is not a file of this user's: not read", path)
        return None
    return fd


def _open_own(path: Path, flags: int) -> Optional[BinaryIO]:
    fd = _open_own_fd(path, flags)
    return os.fdopen(fd, "rb") if fd is not None else None
