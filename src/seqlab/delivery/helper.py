"""The delivery process: one per training process and store, delivering the journals of every run
that process owns (a run alone, every member of a pack, every job of a sweep), in order, to the
store; and `Delivery`, the training side's handle on it.

Why a process: MLflow's per-row cost is Python, and a thread of the training process would hold
the GIL that every PyTorch call of the loop needs back (an in-process sender thread fell about
12,700 values behind in 20 s of training). The training process only appends to a journal (one
write a batch, delivery.journal) and never waits for the store while it trains. The helper reads
each journal from the last row its store confirmed (so a new helper, a resume and the reaper go
on from the same place), writes at most about five times a second while rows keep coming (each
write locks a SQLite store that the UI and other runs need too), at once when the training side
asks (a run's end, a checkpoint), and retries while the store does not answer: a server that is
away is waited for, training goes on, and its rows go when it is back. It runs at a lower priority
and ignores Ctrl-C and a scheduler's SIGTERM: the training process decides when to stop.

    SEQLAB_DELIVERY_URI=... python -m seqlab.delivery.helper   # JSON lines on stdin, events on stdout

It also draws a run's training-curves figure while the training process logs the run's models
(delivery.figures: the GIL-bound 0.1 s of a picture on a core that is free at a run's end).

The store's address goes in the environment, not the command line, which any user of the machine
can read with ps (an address may hold a password). Messages in: {"open": run, "folder": path},
{"close": run} (no more rows come: deliver the rest, then forget it), {"now": 1}, {"figure":
curves, "id": n} (delivery.figures.Curves.message: drawn after the rows waiting). Events out, one
JSON line each: {"sent": n} after each write (the training side's wake-up; the journal's count is
the record), {"drawn": n[, "error": text]}, {"say": text} for a line the training process logs."""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from seqlab.delivery.figures import WAIT_S, Curves, DrawnHere
from seqlab.delivery.journal import MetricJournal, Tail, deliver, deliver_all, open_tail
from seqlab.delivery.stores import open_rows, transient
from seqlab.secrets import mask_uris

log = logging.getLogger("seqlab")

POLL_S = 0.2  # a new row is in the store within about this, plus the write interval
MIN_WRITE_INTERVAL_S = 0.2  # while rows keep coming, at most about five writes a second
RETRY_S = 2.0  # a store that does not answer is tried again this often
MAX_PENDING_ROWS = 200_000  # read ahead of the store at most this (the journal holds the rest)


# -- the helper process ---------------------------------------------------------------------------
class _Helper:
    def __init__(self, tracking_uri: str, give_up_s: float) -> None:
        self.tracking_uri = tracking_uri
        self.writer: Any = None  # opened as it starts (run; delivery.stores.open_rows)
        self.tails: dict[str, Tail] = {}
        self.closing: set[str] = set()
        # (id, figure) in the order asked for: one drawn between writes
        self.figures: list[tuple[Any, Curves]] = []
        self.give_up_s = give_up_s  # after the training process is gone, a store away this long
        self.down_since: Optional[float] = None
        self.last_write = 0.0
        self.out = sys.stdout.buffer
        os.set_blocking(self.out.fileno(), False)

    def say(self, event: dict[str, Any]) -> None:
        try:
            self.out.write(json.dumps(event).encode() + b"\n")
            self.out.flush()
        except (BlockingIOError, BrokenPipeError, OSError):
            pass  # the training side is busy or gone: its wake-ups are not needed, the count is on disk

    def take(self, message: dict[str, Any]) -> None:
        if "open" in message:
            run_id = str(message["open"])
            # The same run again (resumed in this process): its earlier journal was delivered
            # before it ended and is removed; this one is new.
            self.closing.discard(run_id)
            if run_id in self.tails:
                self.tails.pop(run_id).close()
            tail = open_tail(Path(message["folder"]), run_id)
            if tail is None:
                self.say({"say": f"delivery  run {run_id}: its journal cannot be read"})
            else:
                self.tails[run_id] = tail
        elif "close" in message:
            self.closing.add(str(message["close"]))
        elif "figure" in message:
            self.figures.append((message["id"], Curves.of(message["figure"])))

    def draw(self) -> None:
        """The first figure asked for, drawn; the training side told (or why not: it draws it then)."""
        asked, curves = self.figures.pop(0)
        try:
            curves.draw()
            self.say({"drawn": asked})
        except Exception as error:  # noqa: BLE001 - the training process draws it itself
            self.say({"drawn": asked, "error": " ".join(str(error).split())[:300]})

    def open_writer(self) -> None:
        self.writer = open_rows(self.tracking_uri, lambda text: self.say({"say": text}))

    def deliver(self) -> bool:
        """One pass over every journal; False while the store does not answer."""
        sent = 0
        for run_id, tail in list(self.tails.items()):
            try:
                if len(tail.pending) < MAX_PENDING_ROWS:
                    tail.read()
                if tail.pending and self.writer is None:
                    self.open_writer()
                sent += deliver(tail, self.writer, run_id)
            except Exception as error:  # noqa: BLE001 - classified
                if not transient(error):
                    # Refused (a run deleted in the UI, a 4xx): it would fail again; the run's own
                    # records go on, the other runs' too.
                    self.say(
                        {
                            "say": f"delivery  the store refused run {run_id}'s metrics: {' '.join(str(error).split())[:300]}"
                        }
                    )
                    tail.confirm(len(tail.pending))
                    tail.pending.clear()
                    continue
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    self.say(
                        {
                            "down": 1,
                            "say": f"tracking  the store at {mask_uris(self.tracking_uri)} does not answer: "
                            "training goes on, its metrics wait in their journals and are sent when it is back",
                        }
                    )
                return False
            if run_id in self.closing and not tail.pending and not tail.rows_waiting():
                tail.close()
                del self.tails[run_id]
                self.closing.discard(run_id)
        if self.down_since is not None:
            self.say(
                {
                    "back": 1,
                    "say": f"tracking  the store is back after {time.monotonic() - self.down_since:.0f} s: "
                    "the waiting metrics were sent",
                }
            )
            self.down_since = None
        self.last_write = time.monotonic()
        if sent:
            self.say({"sent": sent})
        return True

    def run(self) -> int:
        stdin = sys.stdin.buffer.fileno()
        partial, eof, urgent, ok = b"", False, False, True
        ended_at = None
        while True:
            wait = POLL_S if ok else RETRY_S
            if self.figures and not eof:
                wait = 0  # a figure waits to be drawn: messages first, then the rows, then it
            if not eof and select.select([stdin], [], [], wait)[0]:
                data = os.read(stdin, 1 << 16)
                if not data:
                    eof, ended_at = True, time.monotonic()
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    urgent = urgent or "now" in message
                    self.take(message)
                if not urgent and not eof and self._soon() and not self.figures:
                    continue  # more may come: it joins the next write
            elif eof and not ok:
                time.sleep(RETRY_S)
            urgent = False
            ok = self.deliver()
            if self.figures and not eof:  # no one waits for a figure once the training side is gone
                self.draw()
            if eof and (
                (ok and not any(t.pending or t.rows_waiting() for t in self.tails.values()))
                or time.monotonic() - ended_at > self.give_up_s
            ):
                return 0  # what is left stays in the journals: a resume or the reaper delivers it

    def _soon(self) -> bool:
        return time.monotonic() - self.last_write < MIN_WRITE_INTERVAL_S


def _main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training process decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # While a store is away this process says so once (to the training process's log); urllib3
    # and MLflow would print a warning a retry on the terminal.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    helper = _Helper(
        os.environ["SEQLAB_DELIVERY_URI"], float(os.environ.get("SEQLAB_DELIVERY_GIVE_UP_S", "60"))
    )
    # The writer before the first rows, and before this process lowers its priority: a server's
    # goes through MLflow's client, whose import is 1.5 s of CPU; at nice 10 beside a training
    # that keeps every core busy it took 27 s here, and the first rows would wait for it. What
    # is left at the lower priority is a write now and then. One that fails here is opened again
    # at the first rows, where its error is classified (deliver).
    try:
        helper.open_writer()
    except Exception:  # noqa: BLE001 - retried and classified at the first rows
        helper.writer = None
    os.nice(int(os.environ.get("SEQLAB_DELIVERY_NICE", "10")))
    return helper.run()


# -- the training side ----------------------------------------------------------------------------
class Delivery:
    """The training process's handle on its delivery process for one store (`Delivery.to(uri)`):
    `open` a run's journal, `wait` until the store holds it, `close` it. Never blocks training:
    `check()` (each time rows are journaled) only reads what the helper said and finds it dead, in
    which case a new one goes on from the journals' counts."""

    _running: dict[str, "Delivery"] = {}
    _owner = 0  # the process these helpers belong to (a forked child starts its own)
    # How a helper starts: a new Python. (The tests' runs inside their own process fork it from
    # a Python that has its imports made: tests/harness/zygote.py.)
    launch = staticmethod(subprocess.Popen)

    @classmethod
    def to(cls, tracking_uri: str, give_up_s: float = 60.0) -> "Delivery":
        if cls._owner != os.getpid():
            cls._running, cls._owner = {}, os.getpid()
        if tracking_uri not in cls._running:
            # A process uses one store, but for a sweep's parent elsewhere or a test's many: a
            # helper with no run open is ended when another store's starts.
            for idle in list(cls._running.values()):
                if not idle.journals:
                    idle.stop()
            cls._running[tracking_uri] = cls(tracking_uri, give_up_s)
        return cls._running[tracking_uri]

    def __init__(self, tracking_uri: str, give_up_s: float) -> None:
        self.tracking_uri, self.give_up_s = tracking_uri, give_up_s
        self.journals: dict[str, MetricJournal] = {}
        self.down = False  # the helper said the store does not answer (and not yet that it is back)
        self.gave_up = False  # a wait ended while it was down: the next ones do not wait again
        self.heard = b""
        self.drawn: dict[int, Optional[str]] = {}  # figures the helper said it drew: id -> error
        self.asked = 0  # figures asked for (their ids)
        self.proc: Optional[subprocess.Popen] = None
        self._start()
        atexit.register(self.stop)

    def _start(self) -> None:
        env = {
            **os.environ,
            "SEQLAB_DELIVERY_URI": self.tracking_uri,
            "SEQLAB_DELIVERY_GIVE_UP_S": str(self.give_up_s),
        }
        # Its own stderr (a traceback, if it dies), read when it is found dead: not the terminal's,
        # which a helper that outlives a killed trainer would otherwise hold open for its reader.
        self.errors = tempfile.TemporaryFile(prefix="seqlab-delivery-")
        self.proc = self.launch(
            [sys.executable, "-m", "seqlab.delivery.helper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            env=env,
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        for journal in self.journals.values():
            self._tell({"open": journal.run_id, "folder": str(journal.folder)})

    def _tell(self, message: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # a broken pipe; closed by stop()
            pass  # the helper is gone: check() starts a new one, which reads the journals again

    def open(self, journal: MetricJournal) -> None:
        self.check()
        self.journals[journal.run_id] = journal
        self._tell({"open": journal.run_id, "folder": str(journal.folder)})

    def close(self, journal: MetricJournal) -> None:
        """No more rows come for this run (the helper delivers what is left, then lets it go)."""
        self.journals.pop(journal.run_id, None)
        self._tell({"close": journal.run_id})

    def check(self) -> None:
        """What the helper said, logged; a helper that died replaced (said in one line)."""
        self._hear()
        if self.proc.poll() is not None:
            self.errors.seek(0)
            said = self.errors.read().decode(errors="replace").strip().splitlines()
            log.warning(
                "delivery  the delivery process stopped (%s): a new one goes on from the journals, "
                "nothing is lost",
                said[-1][:300] if said else f"exit status {self.proc.returncode}",
            )
            self.errors.close()
            self._start()

    def _hear(self) -> bool:
        try:
            data = self.proc.stdout.read() or b""
        except (BlockingIOError, OSError):
            data = b""
        *lines, self.heard = (self.heard + data).split(b"\n")
        for line in lines:
            event = json.loads(line)
            self.down = (self.down or "down" in event) and "back" not in event
            self.gave_up = self.gave_up and self.down
            if "say" in event:
                log.warning("%s", event["say"])
            if "drawn" in event:
                self.drawn[event["drawn"]] = event.get("error")
        return bool(lines)

    def wait(self, journal: MetricJournal, stall_s: float) -> bool:
        """True once the store holds every row of `journal`; False after stall_s in which it
        confirmed none (a store that keeps taking rows, slower than training, is waited for:
        slow is not down)."""
        if journal.sent >= journal.count:
            return True
        self.check()
        if self.down and self.gave_up:
            return False  # another run's end already waited for this store, which has not come back
        self._tell({"now": 1})
        sent, deadline = journal.sent, time.monotonic() + stall_s
        while sent < journal.count:
            self.check()
            if journal.sent != sent:
                sent, deadline = journal.sent, time.monotonic() + stall_s
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self.gave_up = self.down
                return False
            select.select([self.proc.stdout], [], [], min(left, 0.1))
        return True

    def draw(self, curves: Curves) -> "Drawing":
        """The figure drawn by the helper, while this process goes on; `Drawing.wait` for it."""
        self.check()
        self.asked += 1
        self._tell({"figure": curves.message(), "id": self.asked})
        return Drawing(self, curves, self.proc, self.asked)

    def take_over(self, journal: MetricJournal) -> None:
        """A helper that does not deliver (stopped, stalled): killed, `journal` delivered from this
        process with the same code, and a new helper for the rest (said in one line)."""
        log.warning(
            "delivery  the delivery process did not deliver run %s's metrics in time: they are "
            "written from here",
            journal.run_id,
        )
        self.proc.kill()
        self.proc.wait()
        tail = open_tail(journal.folder, journal.run_id)
        if tail is not None:
            try:
                deliver_all(tail, open_rows(self.tracking_uri), journal.run_id)
            finally:
                tail.close()
        self._start()

    def stop(self) -> None:
        """The process ends (or no run of this store is open): its helper delivers what is left
        (for at most give_up_s), then ends. A later run of this store starts a new one."""
        if Delivery._running.get(self.tracking_uri) is self:
            del Delivery._running[self.tracking_uri]
        try:
            self.proc.stdin.close()
        except OSError:
            pass


@dataclass
class Drawing:
    """A figure the helper `proc` was asked to draw."""

    delivery: Delivery
    curves: Curves
    proc: Any
    asked: int  # its id

    def wait(self, wait_s: float = WAIT_S) -> Path:
        """The figure's PNG once drawn: the helper's, or this process's where the helper said it
        could not, was replaced (the request went with it) or took longer than `wait_s`."""
        d, asked = self.delivery, self.asked
        deadline = time.monotonic() + wait_s
        while asked not in d.drawn:
            d.check()
            if asked in d.drawn or d.proc is not self.proc or time.monotonic() > deadline:
                break
            select.select([d.proc.stdout], [], [], 0.05)
        if d.drawn.pop(asked, "not drawn") is not None:
            return DrawnHere(self.curves).wait()
        self.curves.discard()
        return self.curves.png


if __name__ == "__main__":
    raise SystemExit(_main())
