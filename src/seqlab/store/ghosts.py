"""Runs left RUNNING by a process that died without closing them (kill -9, the OOM killer, a
closed laptop, a preempted node). Each run records which process owns it (host, boot, pid
namespace, machine id, pid and the process's start time since boot, so that a reused pid is not taken for
the owner) and a heartbeat it renews about every minute; a run that ends gives up its process
tag, so a run reopened later by another client has no owner to judge. Whenever a seqlab command
opens a store, it ends KILLED, with a `failure_reason`, the runs whose owner is gone: on this
machine (same host, same pid namespace), when no process with that pid and start time exists,
or the machine has restarted since; elsewhere (another host, a container with its own pids),
when this observer has seen the same heartbeat for HEARTBEAT_TIMEOUT_S by its own clock (two
machines' clocks are never compared). A run whose owner cannot be judged is left alone: a live
run is never marked.

Light imports only: MLflow loads inside the functions that need it."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import psutil

from seqlab import one_line
from seqlab.delivery.journal import deliver_journal, end_status
from seqlab.resume.points import STOPPED_AT
from seqlab.secrets import mask_text

log = logging.getLogger("seqlab")

HOST, PID, STARTED, HEARTBEAT = "process_host", "process_pid", "process_started", "heartbeat"
# Where the pid means something: the kernel's boot and the pid namespace (a container's own pids);
# the start time in clock ticks since boot, which a step of the wall clock (NTP, a VM resumed)
# does not move, as it moves psutil's create_time (computed from the boot time).
BOOT, PIDNS, START_TICKS = "process_boot", "process_pidns", "process_start_ticks"
# Which machine: its /etc/machine-id. A host name is not one (cloned VMs and containers with a
# fixed host name share it), nor is the initial pid namespace's id (the same on every Linux host).
MACHINE = "process_machine"
HEARTBEAT_EVERY_S = 60.0
# Another host's run is ended after this long without a heartbeat: many missed beats, so that a
# loaded machine or a server away for a while does not end a live run.
HEARTBEAT_TIMEOUT_S = 15 * 60.0
REASON = "process ended without closing the run"
# A sweep's parent run names its process too (seqlab.sweeps.callback); it has no start time or heartbeat.
_SWEEP_HOST, _SWEEP_PID = "sweep_host", "sweep_pid"


def process_started(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch), None if there is no such process."""
    try:
        return round(psutil.Process(pid).create_time(), 2)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.Error:
        return None


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@functools.lru_cache(maxsize=None)  # read once a process: the reaper asks for every RUNNING run
def machine_id() -> str:
    """This machine's id: systemd's /etc/machine-id (D-Bus's copy where it is missing), else its
    boot id and host name (then a restart makes it another machine, judged by its heartbeat)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            found = Path(path).read_text().strip()
        except OSError:
            continue
        if found:
            return found
    return f"{boot_id()}@{socket.gethostname()}"


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def proc_stat(pid: int) -> Optional[tuple[str, str]]:
    """(state, start time in clock ticks since boot) of process `pid` from /proc, None where it
    cannot be read (no /proc, hidepid=2 hiding another user's process, gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[0], fields[19]


def identity(now: Callable[[], float] = time.time) -> dict[str, str]:
    """The tags that say which process owns a run, and its first heartbeat."""
    pid = os.getpid()
    stat = proc_stat(pid)
    return {
        HOST: socket.gethostname(),
        PID: str(pid),
        STARTED: str(process_started(pid) or ""),
        MACHINE: machine_id(),
        BOOT: boot_id(),
        PIDNS: pid_namespace(),
        START_TICKS: stat[1] if stat else "",
        HEARTBEAT: str(int(now())),
    }


def _exists(pid: int) -> bool:
    """Whether a process `pid` exists, also one this user may not see in /proc (hidepid=2) or signal."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_gone(pid: int, tags: Mapping[str, str]) -> Optional[str]:
    """Why process `pid`, as the run's tags describe it, no longer runs; None if it may."""
    if pid == os.getpid():
        return None
    if not _exists(pid):
        return f"pid {pid} is gone"
    stat = proc_stat(pid)
    if stat is None:
        return None  # it exists, but is not ours to inspect
    if stat[0] == "Z":
        return f"pid {pid} has exited"
    ticks = tags.get(START_TICKS, "")
    if ticks:
        return f"pid {pid} now belongs to another process" if ticks != stat[1] else None
    # A run from before START_TICKS: the start time in seconds, as it was recorded.
    started, now_started = tags.get(STARTED, ""), process_started(pid)
    try:
        if started and now_started is not None and abs(now_started - float(started)) > 1.0:
            return f"pid {pid} now belongs to another process"
    except ValueError:
        pass
    return None


def why_dead(
    tags: Mapping[str, str],
    now: float,
    host: Optional[str] = None,
    timeout_s: float = HEARTBEAT_TIMEOUT_S,
    beat_seen: Optional[float] = None,
) -> Optional[str]:
    """Why the owner of a RUNNING run with these tags is gone; None if it is alive or cannot be
    told. `beat_seen`: when this observer (its own clock, `now`) first saw the run's current
    heartbeat value; a run elsewhere is judged by that alone."""
    here = host or socket.gethostname()
    run_host, pid = tags.get(HOST) or tags.get(_SWEEP_HOST), tags.get(PID) or tags.get(_SWEEP_PID)
    if not run_host or not pid or not pid.isdigit():
        return None  # not a seqlab run, one from before these tags, or one that ended (reopened by another client)
    # This machine's pids: the same host name and machine id (a run from before MACHINE: the host name
    # alone), and the same pid namespace.
    same_machine = run_host == here and (not tags.get(MACHINE) or tags[MACHINE] == machine_id())
    same_pids = same_machine and tags.get(PIDNS, pid_namespace()) == pid_namespace()
    if same_pids:
        if tags.get(BOOT) and boot_id() and tags[BOOT] != boot_id():
            return f"{REASON} (the machine {here} has restarted since)"
        gone = _pid_gone(int(pid), tags if tags.get(PID) else {})
        return f"{REASON} ({gone} on {here})" if gone else None
    where = (
        run_host
        if run_host != here
        else f"{run_host} (another {'pid namespace' if same_machine else 'machine'})"
    )
    if not tags.get(HEARTBEAT) or beat_seen is None:
        return None  # nothing tells whether it lives, or not yet seen for long enough
    if now - beat_seen > timeout_s:
        return f"{REASON} (its heartbeat from {where} has not changed for {(now - beat_seen) / 60:.0f} min)"
    return None


class BeatsSeen:
    """When this observer first saw each run's current heartbeat value, by its own clock: a file
    per user (the cache folder), so that commands minutes apart add up to a judgement and two
    machines' clocks are never compared (skew; a heartbeat written by a clock far ahead)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.seen: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.seen = {}
        self.changed = False

    @classmethod
    def of_store(cls, tracking_uri: str) -> "BeatsSeen":
        """This user's record for one store (its URL hashed: the file name shows no password)."""
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cls(
            cache
            / "seqlab"
            / f"heartbeats-{hashlib.sha1(str(tracking_uri).encode()).hexdigest()[:16]}.json"
        )

    def first_seen(self, run_id: str, beat: str, now: float) -> float:
        value = self.seen.get(run_id)
        if value is None or value[0] != beat:
            self.seen[run_id], self.changed = [beat, now], True
            return now
        return float(value[1])

    def forget(self, run_id: str) -> None:
        self.changed |= self.seen.pop(run_id, None) is not None

    def save(self, running: set[str]) -> None:
        """Keep what is still running; written whole (another command may write it at the same time: the last one wins)."""
        stale = set(self.seen) - running
        if not (self.changed or stale):
            return
        for run_id in stale:
            self.seen.pop(run_id)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.seen))
            os.replace(tmp, self.path)
        except OSError:
            pass  # an unwritable cache: other hosts' runs are then never judged, which ends no live one


def _running_runs(client: Any) -> Iterator[Any]:
    """The store's RUNNING runs that a user has not deleted: a deleted run (or one in a deleted
    experiment) cannot be changed, MLflow refuses to, and it is out of everybody's way already."""
    from mlflow.entities import ViewType  # MLflow: a reaping only (the light path imports us)

    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    token = None
    while ids:
        page = client.search_runs(
            ids,
            "attributes.status = 'RUNNING'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
            page_token=token,
        )
        yield from page
        token = page.token
        if not token:
            break


def end_dead_runs(
    client: Any,
    now: Callable[[], float] = time.time,
    host: Optional[str] = None,
    timeout_s: float = HEARTBEAT_TIMEOUT_S,
    seen: Optional[BeatsSeen] = None,
) -> list[tuple[str, str]]:
    """End KILLED every RUNNING run of the store whose process is gone; return (run id, reason)."""

    seen = seen or BeatsSeen.of_store(client.tracking_uri)
    ended, running = [], set()
    for run in _running_runs(client):
        run_id = run.info.run_id
        running.add(run_id)
        beat = run.data.tags.get(HEARTBEAT)
        first = seen.first_seen(run_id, beat, now()) if beat else None
        reason = why_dead(run.data.tags, now(), host, timeout_s, beat_seen=first)
        if reason is None:
            continue
        seen.forget(run_id)
        try:
            status = _deliver_journal(client, run)
            if status != "FINISHED":  # else its training ended, only its store was away
                client.set_tag(
                    run_id, "failure_reason", mask_text(reason)
                )  # every failure_reason masked where it is written
            client.set_terminated(run_id, status)
        except Exception as refused:  # noqa: BLE001 - deleted meanwhile, another user's, no permission
            # A run this command cannot change is left as it is: never a reason not to start.
            log.warning(
                "tracking  run %s (%s) was left RUNNING (%s) and cannot be ended from here: %s",
                run_id,
                run.info.run_name,
                reason,
                one_line(refused),
            )
            continue
        ended.append((run_id, reason))
        resumable = f"; continue it with resume={run_id}" if STOPPED_AT in run.data.tags else ""
        log.warning(
            "tracking  run %s (%s) was left RUNNING: %s; ended %s%s",
            run_id,
            run.info.run_name,
            reason,
            status,
            resumable if status == "KILLED" else "",
        )
    seen.save(running)
    return ended


def _deliver_journal(client: Any, run: Any) -> str:
    """What the dead process journaled and its store never confirmed, from the journal in its
    job's folder (seqlab.delivery.journal) where this machine has it and it is this user's: stored
    before the run ends. The status to end it with: the one its process left beside the journal
    (its training ended, its store did not take the journal in time), else KILLED."""
    folder = run.data.params.get("paths.output_dir")
    if not folder or not Path(folder).is_dir():
        return "KILLED"
    status = end_status(Path(folder), run.info.run_id) or "KILLED"
    sent = deliver_journal(client.tracking_uri, run.info.run_id, Path(folder))
    if sent:
        log.warning(
            "tracking  run %s: %d metric value(s) its process had journaled and its store never "
            "confirmed were sent",
            run.info.run_id,
            sent,
        )
    return status


class Heartbeat:
    """Renews a run's heartbeat tag every `every_s` seconds from a daemon thread with its own
    client: one small write a minute, off the training loop. Before each beat it reads the run's
    status: a run ended by another process while this one lived (a reaper elsewhere that saw no beat
    for 15 minutes: a laptop asleep, Ctrl-Z, a network partition) stops this process at its next
    step, as SIGTERM does (checkpoint kept, resumable), so that two processes never write one run."""

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        every_s: float = HEARTBEAT_EVERY_S,
        now: Callable[[], float] = time.time,
        ours: Callable[[], bool] = lambda: False,
    ) -> None:
        self.tracking_uri, self.run_id, self.every_s, self.now = tracking_uri, run_id, every_s, now
        self.ours = ours  # whether this process has ended the run itself
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.beats = 0

    def beat(self, client: Any) -> None:
        client.set_tag(self.run_id, HEARTBEAT, str(int(self.now())))
        self.beats += 1

    def ended_elsewhere(self, client: Any) -> Optional[str]:
        """What another process did to the run (ended it, or continued it as its own); None: it is still this one's."""
        run = client.get_run(self.run_id)
        if self.ours() or self._stop.is_set():
            return None
        if run.info.status != "RUNNING":
            return f"was ended {run.info.status} by another process"
        tags = run.data.tags
        if tags.get(PID) and (
            tags[PID] != str(os.getpid()) or tags.get(MACHINE, machine_id()) != machine_id()
        ):
            return f"was continued by another process (pid {tags[PID]} on {tags.get(HOST)})"
        return None

    def _run(self) -> None:
        client = None
        while not self._stop.wait(self.every_s):
            try:
                if client is None:
                    import mlflow  # as ViewType above

                    client = mlflow.MlflowClient(self.tracking_uri)
                what = self.ended_elsewhere(client)
                if what is not None:
                    log.error(
                        "stopping  run %s %s while this one trained (its heartbeat went unseen: a machine asleep, "
                        "Ctrl-Z, a network partition); this process stops at its next step, its checkpoint kept, "
                        "so that no two processes write one run",
                        self.run_id,
                        what,
                    )
                    os.kill(
                        os.getpid(), signal.SIGTERM
                    )  # the graceful stop's way: a checkpoint, then the exit
                    return
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
def heartbeat(tracker: Any, every_s: Optional[float] = None) -> Iterator[Optional[Heartbeat]]:
    """While the block runs, the tracker's run renews its heartbeat (not on DDP ranks > 0, which
    own no run)."""
    if not getattr(tracker, "run_id", None):
        yield None
        return
    beat = Heartbeat(
        tracker.tracking_uri,
        tracker.run_id,
        every_s or HEARTBEAT_EVERY_S,
        ours=lambda: getattr(tracker, "ended", False),
    ).start()
    try:
        yield beat
    finally:
        beat.stop()
