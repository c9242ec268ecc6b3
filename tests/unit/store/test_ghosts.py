"""Issue 15, point 2: no RUNNING ghosts. A run records the process that owns it (host, pid, start
time) and a heartbeat; a seqlab command that opens the store ends KILLED, with a failure_reason,
the runs whose process is gone, and never a live one."""

from __future__ import annotations

import os
import time

from harness.ghosts import HERE, NOW, _tags

from seqlab.store import ghosts


def test_the_heartbeat_renews_the_runs_last_alive_time(store):
    experiment = store.create_experiment("beats")
    run_id = store.create_run(experiment, tags=_tags(beat=NOW - 3600)).info.run_id
    clock = [NOW]
    beat = ghosts.Heartbeat(
        str(store.tracking_uri), run_id, every_s=0.01, now=lambda: clock[0]
    ).start()
    try:
        deadline = time.monotonic() + 60
        while beat.beats == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        beat.stop()
    assert beat.beats > 0
    assert store.get_run(run_id).data.tags[ghosts.HEARTBEAT] == str(int(NOW))
    # so another host's store, opened now, leaves it running
    tags = dict(store.get_run(run_id).data.tags, **{ghosts.HOST: "elsewhere"})
    assert ghosts.why_dead(tags, NOW + 60) is None


def test_a_run_from_before_the_machine_restarted_is_dead_whatever_runs_under_its_pid_now():
    tags = {
        **_tags(started=ghosts.process_started(os.getpid())),
        ghosts.BOOT: "an-earlier-boot",
        ghosts.PIDNS: ghosts.pid_namespace(),
    }
    tags[ghosts.PID] = str(os.getppid())  # a live process has that pid now
    assert (
        ghosts.why_dead(tags, NOW)
        == f"process ended without closing the run (the machine {HERE} has restarted since)"
    )


def test_a_clock_step_does_not_make_a_live_process_look_like_another():
    # NTP or a resumed VM steps the wall clock: psutil's create_time (boot time + ticks, the boot
    # time read from the wall clock) moves with it. The start in ticks since boot does not.
    parent = os.getppid()
    tags = _tags(
        pid=parent, started=ghosts.process_started(parent) - 100
    )  # as after a 100 s clock step
    tags.update(
        {
            ghosts.START_TICKS: ghosts.proc_stat(parent)[1],
            ghosts.BOOT: ghosts.boot_id(),
            ghosts.PIDNS: ghosts.pid_namespace(),
        }
    )
    assert ghosts.why_dead(tags, NOW) is None
    tags[ghosts.START_TICKS] = str(
        int(ghosts.proc_stat(parent)[1]) + 1
    )  # a reused pid: another start
    assert (
        ghosts.why_dead(tags, NOW)
        == f"process ended without closing the run (pid {parent} now belongs to another process on {HERE})"
    )


def test_a_cloned_machine_with_this_hosts_name_and_pid_namespace_id_is_judged_by_its_heartbeat():
    # Issue 34, point 5: cloned VMs (or containers with a fixed host name) share the host name, and
    # every host's initial pid namespace has the same id; their boot ids differ. Before, a live run of
    # the clone looked like this machine's from before a restart, and was ended.
    tags = {
        **_tags(pid=os.getppid(), started=1.0, beat=NOW),
        ghosts.BOOT: "the-clones-boot",
        ghosts.PIDNS: ghosts.pid_namespace(),
        ghosts.MACHINE: "the-clones-machine-id",
    }
    assert ghosts.machine_id() and ghosts.machine_id() != "the-clones-machine-id"
    assert ghosts.why_dead(tags, NOW) is None
    assert ghosts.why_dead(tags, NOW, beat_seen=NOW - 5 * 60) is None
    assert ghosts.why_dead(tags, NOW, beat_seen=NOW - 20 * 60) == (
        f"process ended without closing the run (its heartbeat from {HERE} (another machine) has not changed for 20 min)"
    )
    # This machine's own run, from before it restarted, is still told by its boot.
    tags[ghosts.MACHINE] = ghosts.machine_id()
    assert (
        ghosts.why_dead(tags, NOW)
        == f"process ended without closing the run (the machine {HERE} has restarted since)"
    )
    assert ghosts.identity()[ghosts.MACHINE] == ghosts.machine_id()
