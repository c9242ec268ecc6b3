"""Runs left RUNNING by a process that died without closing them (kill -9, the OOM killer, a
closed laptop, a preempted node). Each run records which process owns it (host, pid and the
process's start time, so that a reused pid is not taken for the owner) and a heartbeat, a
last-alive time it renews about every minute. Whenever a seqlab command opens a store, it ends
KILLED, with a `failure_reason`, the runs whose owner is gone: on this host, when no process
with that pid and start time exists; on another host, when its heartbeat is older than
HEARTBEAT_TIMEOUT_S. A run whose owner cannot be judged is left alone: a live run is never
marked.

Light imports only: MLflow and psutil load inside the functions that need them."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

from seqlab import one_line
from seqlab.secrets import mask_text

log = logging.getLogger("seqlab")

HOST, PID, STARTED, HEARTBEAT = "process_host", "process_pid", "process_started", "heartbeat"
HEARTBEAT_EVERY_S = 60.0
# Another host's run is ended after this long without a heartbeat: many missed beats, so that a
# loaded machine or a server away for a while does not end a live run.
HEARTBEAT_TIMEOUT_S = 15 * 60.0
REASON = "process ended without closing the run"
# A sweep's parent run names its process too (seqlab.sweeps.callback); it has no start time or heartbeat.
_SWEEP_HOST, _SWEEP_PID = "sweep_host", "sweep_pid"


def process_started(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch), None if there is no such process."""
    import psutil

    try:
        return round(psutil.Process(pid).create_time(), 2)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.Error:
        return None


def identity(now: Callable[[], float] = time.time) -> dict[str, str]:
    """The tags that say which process owns a run, and its first heartbeat."""
    pid = os.getpid()
    return {HOST: socket.gethostname(), PID: str(pid), STARTED: str(process_started(pid) or ""),
            HEARTBEAT: str(int(now()))}


def _pid_gone(pid: int, started: str) -> Optional[str]:
    """Why process `pid` (started at `started`, if known) no longer runs; None if it may."""
    import psutil

    if pid == os.getpid():
        return None
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return f"pid {pid} has exited"
        now_started = round(process.create_time(), 2)
    except psutil.NoSuchProcess:  # a zombie that was reaped in between too
        return f"pid {pid} is gone"
    except psutil.Error:
        return None  # it exists, but is not ours to inspect
    try:
        if started and abs(now_started - float(started)) > 1.0:
            return f"pid {pid} now belongs to another process"
    except ValueError:
        pass
    return None


def why_dead(tags: Mapping[str, str], now: float, host: Optional[str] = None,
             timeout_s: float = HEARTBEAT_TIMEOUT_S) -> Optional[str]:
    """Why the owner of a RUNNING run with these tags is gone; None if it is alive or cannot be told."""
    here = host or socket.gethostname()
    run_host, pid = tags.get(HOST) or tags.get(_SWEEP_HOST), tags.get(PID) or tags.get(_SWEEP_PID)
    if not run_host or not pid or not pid.isdigit():
        return None  # not a seqlab run, or one from before these tags
    if run_host == here:
        gone = _pid_gone(int(pid), tags.get(STARTED, "") if tags.get(PID) else "")
        return f"{REASON} ({gone} on {here})" if gone else None
    beat = tags.get(HEARTBEAT, "")
    try:
        age = now - float(beat)
    except ValueError:
        return None  # another host's run without a heartbeat: nothing tells whether it lives
    if age > timeout_s:
        return f"{REASON} (no heartbeat from {run_host} for {age / 60:.0f} min)"
    return None


def _running_runs(client: Any) -> Iterator[Any]:
    """The store's RUNNING runs that a user has not deleted: a deleted run (or one in a deleted
    experiment) cannot be changed, MLflow refuses to, and it is out of everybody's way already."""
    from mlflow.entities import ViewType

    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    token = None
    while ids:
        page = client.search_runs(ids, "attributes.status = 'RUNNING'", run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            break


def end_dead_runs(client: Any, now: Callable[[], float] = time.time, host: Optional[str] = None,
                  timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[tuple[str, str]]:
    """End KILLED every RUNNING run of the store whose process is gone; return (run id, reason)."""
    from seqlab.resume.points import STOPPED_AT

    ended = []
    for run in _running_runs(client):
        reason = why_dead(run.data.tags, now(), host, timeout_s)
        if reason is None:
            continue
        run_id = run.info.run_id
        try:
            client.set_tag(run_id, "failure_reason", mask_text(reason))  # every failure_reason masked where it is written
            client.set_terminated(run_id, "KILLED")
        except Exception as refused:  # noqa: BLE001 - deleted meanwhile, another user's, no permission
            # A run this command cannot change is left as it is: never a reason not to start.
            log.warning("tracking  run %s (%s) was left RUNNING (%s) and cannot be ended from here: %s",
                        run_id, run.info.run_name, reason, one_line(refused))
            continue
        ended.append((run_id, reason))
        resumable = f"; continue it with resume={run_id}" if STOPPED_AT in run.data.tags else ""
        log.warning("tracking  run %s (%s) was left RUNNING: %s; ended KILLED%s",
                    run_id, run.info.run_name, reason, resumable)
    return ended


class Heartbeat:
    """Renews a run's heartbeat tag every `every_s` seconds from a daemon thread with its own
    client: one small write a minute, off the training loop."""

    def __init__(self, tracking_uri: str, run_id: str, every_s: float = HEARTBEAT_EVERY_S,
                 now: Callable[[], float] = time.time) -> None:
        self.tracking_uri, self.run_id, self.every_s, self.now = tracking_uri, run_id, every_s, now
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.beats = 0

    def beat(self, client: Any) -> None:
        client.set_tag(self.run_id, HEARTBEAT, str(int(self.now())))
        self.beats += 1

    def _run(self) -> None:
        client = None
        while not self._stop.wait(self.every_s):
            try:
                if client is None:
                    import mlflow

                    client = mlflow.MlflowClient(self.tracking_uri)
                self.beat(client)
            except Exception:  # noqa: BLE001 - a busy store or an away server: the next beat tries again
                pass

    def start(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._run, name="seqlab-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


@contextmanager
def heartbeat(tracker: Any, every_s: float = HEARTBEAT_EVERY_S) -> Iterator[Optional[Heartbeat]]:
    """While the block runs, the tracker's run renews its heartbeat (not on DDP ranks > 0, which
    own no run)."""
    if not getattr(tracker, "run_id", None):
        yield None
        return
    beat = Heartbeat(tracker.tracking_uri, tracker.run_id, every_s).start()
    try:
        yield beat
    finally:
        beat.stop()
