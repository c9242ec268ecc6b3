"""Issue 15, point 2: no RUNNING ghosts. A run records the process that owns it (host, pid, start
time) and a heartbeat; a seqlab command that opens the store ends KILLED, with a failure_reason,
the runs whose process is gone, and never a live one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, cli_env, start_cli
from harness import zygote
from harness.ghosts import HERE, NOW, _tags
from harness.inprocess import run_script

from seqlab.store import ghosts


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_who_is_dead_is_told_by_pid_and_start_time_here_and_by_heartbeat_elsewhere():
    me = os.getpid()
    assert ghosts.why_dead(_tags(pid=me, started=ghosts.process_started(me)), NOW) is None
    parent = os.getppid()
    assert (
        ghosts.why_dead(_tags(pid=parent, started=ghosts.process_started(parent)), NOW) is None
    )  # alive
    assert ghosts.why_dead(_tags(pid=parent), NOW) is None  # alive, start time not recorded
    dead = _dead_pid()
    assert (
        ghosts.why_dead(_tags(pid=dead, started=1.0), NOW)
        == f"process ended without closing the run (pid {dead} is gone on {HERE})"
    )
    # the pid was given to another process since: the start time tells
    assert (
        ghosts.why_dead(_tags(pid=parent, started=ghosts.process_started(parent) - 100), NOW)
        == f"process ended without closing the run (pid {parent} now belongs to another process on {HERE})"
    )
    # another host: its pids mean nothing here; a heartbeat this observer has seen unchanged for
    # long enough, by its own clock, does (the value itself is the other host's clock: never compared)
    assert (
        ghosts.why_dead(_tags("elsewhere", dead, beat=NOW - 1), NOW, beat_seen=NOW - 20 * 60)
        == "process ended without closing the run (its heartbeat from elsewhere has not changed for 20 min)"
    )
    assert (
        ghosts.why_dead(_tags("elsewhere", dead, beat=NOW - 3600), NOW, beat_seen=NOW - 5 * 60)
        is None
    )
    assert (
        ghosts.why_dead(_tags("elsewhere", dead, beat=NOW - 3600), NOW) is None
    )  # not seen before
    assert (
        ghosts.why_dead(_tags("elsewhere", dead), NOW, beat_seen=NOW - 3600) is None
    )  # no heartbeat: cannot be told
    assert ghosts.why_dead({}, NOW) is None  # not a seqlab run
    # a sweep's parent run names its process with sweep_host/sweep_pid
    assert ghosts.why_dead({"sweep_host": HERE, "sweep_pid": str(dead)}, NOW) is not None
    assert ghosts.why_dead({"sweep_host": HERE, "sweep_pid": str(me)}, NOW) is None


def test_opening_a_store_ends_its_dead_runs_killed_and_leaves_live_ones_running(store):
    experiment = store.create_experiment("ghosts")
    dead = _dead_pid()
    runs = {
        "dead here": _tags(pid=dead, started=1.0),
        "alive here": _tags(started=ghosts.process_started(os.getpid())),
        "silent elsewhere": _tags("elsewhere", 1, beat=NOW - 3600),
        "beating elsewhere": _tags("elsewhere", 1, beat=NOW - 30),
        "not seqlab's": {},
    }
    ids = {
        name: store.create_run(experiment, run_name=name, tags=tags).info.run_id
        for name, tags in runs.items()
    }
    done = store.create_run(experiment, run_name="finished", tags=_tags(pid=dead)).info.run_id
    store.set_terminated(done, "FINISHED")

    # Another host's run is judged by what this observer saw: at first sight nothing, and once
    # its heartbeat has not changed for 15 minutes of this observer's own clock, ended.
    ended = ghosts.end_dead_runs(store, now=lambda: NOW)
    assert [run_id for run_id, _ in ended] == [ids["dead here"]]
    assert store.get_run(ids["silent elsewhere"]).info.status == "RUNNING"
    later = NOW + 16 * 60
    store.set_tag(
        ids["beating elsewhere"], ghosts.HEARTBEAT, str(int(NOW + 15 * 60))
    )  # it beat meanwhile
    ended += ghosts.end_dead_runs(store, now=lambda: later)
    assert sorted(run_id for run_id, _ in ended) == sorted(
        [ids["dead here"], ids["silent elsewhere"]]
    )
    status = {name: store.get_run(run_id) for name, run_id in ids.items()}
    assert status["dead here"].info.status == "KILLED"
    assert (
        status["dead here"].data.tags["failure_reason"]
        == f"process ended without closing the run (pid {dead} is gone on {HERE})"
    )
    assert status["silent elsewhere"].info.status == "KILLED"
    assert (
        status["silent elsewhere"]
        .data.tags["failure_reason"]
        .startswith("process ended without closing the run")
    )
    for name in ("alive here", "beating elsewhere", "not seqlab's"):
        assert status[name].info.status == "RUNNING", name
    assert store.get_run(done).info.status == "FINISHED"
    assert ghosts.end_dead_runs(store, now=lambda: later) == []  # nothing twice


def _wait_for(what, timeout_s=240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def test_kill_9_mid_run_then_compare_ends_it_killed_while_a_live_run_stays_running(tmp_path, store):
    long_run = ["data.n_samples=256", "trainer.max_epochs=100000"]
    procs = {
        name: start_cli(
            tmp_path,
            *long_run,
            f"logger.run_name={name}",
            f"hydra.run.dir={tmp_path}/out-{name}",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("doomed", "alive")
    }
    try:

        def both_training():
            for proc in procs.values():
                assert proc.poll() is None, "a run ended by itself"
            experiment = store.get_experiment_by_name("seqlab")
            runs = store.search_runs([experiment.experiment_id]) if experiment else []
            named = {r.info.run_name: r for r in runs}
            trained = all(
                name in named and "train_loss" in named[name].data.metrics for name in procs
            )
            return named if trained else None

        runs = _wait_for(both_training)
        doomed = runs["doomed"]
        assert doomed.data.tags[ghosts.PID] == str(procs["doomed"].pid)
        assert doomed.data.tags[ghosts.HOST] == HERE
        assert (
            abs(
                float(doomed.data.tags[ghosts.STARTED])
                - ghosts.process_started(procs["doomed"].pid)
            )
            < 1
        )
        procs["doomed"].send_signal(signal.SIGKILL)
        procs["doomed"].wait(timeout=30)
        assert store.get_run(doomed.info.run_id).info.status == "RUNNING"  # what kill -9 leaves

        compare = run_script(
            ROOT / "scripts" / "compare.py",
            [  # another process than the runs', as a user's would be
                "--experiment",
                "seqlab",
                "--no-log",
                "--tracking-uri",
                f"sqlite:///{tmp_path}/mlruns/mlflow.db",
                "--out",
                str(tmp_path / "compare"),
            ],
        )
        assert "Traceback" not in compare.stderr, compare.stderr[-3000:]
        assert (
            f"run {doomed.info.run_id} (doomed) was left RUNNING: process ended without closing the run"
            in compare.stderr
        )
        doomed = store.get_run(doomed.info.run_id)
        assert doomed.info.status == "KILLED"
        assert (
            doomed.data.tags["failure_reason"]
            == f"process ended without closing the run (pid {procs['doomed'].pid} is gone on {HERE})"
        )
        assert procs["alive"].poll() is None
        assert store.get_run(runs["alive"].info.run_id).info.status == "RUNNING"  # never a live run
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_predict_opening_the_store_ends_its_dead_runs_too(tmp_path, store, caplog):
    """Any seqlab command that opens a store ends its dead runs: predict.py as train and compare do."""
    from conftest import CONF_DIR
    from hydra import compose, initialize_config_dir

    from seqlab.hydra_version import VERSION_BASE
    from seqlab.predict import main

    experiment = store.create_experiment("ghosts")
    dead = store.create_run(
        experiment, run_name="dead here", tags=_tags(pid=_dead_pid(), started=1.0)
    ).info.run_id
    alive = store.create_run(
        experiment, run_name="alive here", tags=_tags(started=ghosts.process_started(os.getpid()))
    ).info.run_id
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose(
            "predict",
            overrides=[
                f"paths.root_dir={tmp_path}",
                f"paths.output_dir={tmp_path / 'p'}",
                f"run={dead}",
            ],
        )
    with pytest.raises(SystemExit):
        main(cfg)  # the run has no model: one line, after the store was opened
    assert store.get_run(dead).info.status == "KILLED"
    assert (
        store.get_run(dead)
        .data.tags["failure_reason"]
        .startswith("process ended without closing the run")
    )
    assert store.get_run(alive).info.status == "RUNNING"


def test_a_dead_run_deleted_in_the_ui_is_left_alone_and_every_command_still_starts(
    store, compose_cfg, tmp_path
):
    # Issue 24, point 1: a run left RUNNING by kill -9, then deleted in the MLflow UI (what a user
    # does with a crashed run). MLflow refuses to change a deleted run; the reaper must not try.
    from seqlab.train import train

    experiment = store.get_experiment_by_name("seqlab")
    experiment_id = experiment.experiment_id if experiment else store.create_experiment("seqlab")
    dead = _dead_pid()
    deleted = store.create_run(
        experiment_id, run_name="crashed", tags=_tags(pid=dead, started=1.0)
    ).info.run_id
    store.delete_run(deleted)
    # And one in an experiment that was deleted whole.
    gone = store.create_experiment("gone")
    in_gone = store.create_run(
        gone, run_name="crashed too", tags=_tags(pid=dead, started=1.0)
    ).info.run_id
    store.delete_experiment(gone)

    assert ghosts.end_dead_runs(store, now=lambda: NOW) == []
    result = train(compose_cfg("data.n_samples=256", "trainer.max_epochs=1"))
    assert result.status == "FINISHED"
    assert (
        store.get_run(deleted).info.lifecycle_stage == "deleted"
        and store.get_run(deleted).info.status == "RUNNING"
    )
    assert store.get_run(in_gone).info.status == "RUNNING"


def test_a_run_the_store_refuses_to_end_is_one_line_not_an_exit(store, caplog):
    # A run the reaper sees but may not change (another user's on a signed-in server; deleted
    # between the search and the update): one warning, and the others are still ended.
    experiment = store.create_experiment("refused")
    dead = _dead_pid()
    first = store.create_run(
        experiment, run_name="not mine", tags=_tags(pid=dead, started=1.0)
    ).info.run_id
    second = store.create_run(
        experiment, run_name="mine", tags=_tags(pid=dead, started=1.0)
    ).info.run_id

    class Refusing:
        def __getattr__(self, name):
            return getattr(store, name)

        def set_tag(self, run_id, key, value):
            if run_id == first:
                from mlflow.exceptions import MlflowException

                raise MlflowException("Permission denied for run " + run_id)
            return store.set_tag(run_id, key, value)

    ended = ghosts.end_dead_runs(Refusing(), now=lambda: NOW)
    assert [run_id for run_id, _ in ended] == [second]
    assert (
        store.get_run(second).info.status == "KILLED"
        and store.get_run(first).info.status == "RUNNING"
    )
    warnings = [
        r.getMessage() for r in caplog.records if "cannot be ended from here" in r.getMessage()
    ]
    assert len(warnings) == 1 and first in warnings[0] and "Permission denied" in warnings[0]


# Issue 24, point 4: the reaper must never end a live run.
def test_a_container_with_this_hosts_name_is_judged_by_its_heartbeat_not_by_pids_here():
    # docker --network host, Kubernetes host networking: the same host name, its own pid namespace.
    tags = {**_tags(pid=_dead_pid(), started=1.0, beat=NOW), ghosts.PIDNS: "pid:[4026532999]"}
    assert ghosts.pid_namespace() and ghosts.pid_namespace() != "pid:[4026532999]"
    assert ghosts.why_dead(tags, NOW) is None
    assert ghosts.why_dead(tags, NOW, beat_seen=NOW - 5 * 60) is None
    assert ghosts.why_dead(tags, NOW, beat_seen=NOW - 20 * 60) == (
        f"process ended without closing the run (its heartbeat from {HERE} (another pid namespace) has not changed for 20 min)"
    )


def test_a_process_hidden_by_hidepid_is_alive_not_gone(monkeypatch):
    # /proc mounted with hidepid=2: another user's process has no /proc entry for this one.
    parent = os.getppid()
    tags = {**_tags(pid=parent, started=ghosts.process_started(parent)), ghosts.START_TICKS: "1"}
    monkeypatch.setattr(ghosts, "proc_stat", lambda pid: None)
    assert ghosts.why_dead(tags, NOW) is None
    dead = _dead_pid()
    assert (
        ghosts.why_dead({**tags, ghosts.PID: str(dead)}, NOW)
        == f"process ended without closing the run (pid {dead} is gone on {HERE})"
    )


def test_a_finished_run_reopened_by_a_plain_mlflow_client_is_left_running(tmp_path, store):
    # The seqlab process that wrote the run has exited; a notebook reopens the run to add to it.
    code = (
        "import sys\n"
        "from seqlab.store.ghosts import identity\n"
        "from seqlab.tracking import MlflowTracker\n"
        "t = MlflowTracker(sys.argv[1], 'reopened')\n"
        "with t.run('r', identity()):\n"
        "    pass\n"
        "print(t.run_id)\n"
    )
    # A process of its own that exits (tests/zygote.py: without a new Python's 5-8 s of imports).
    done = zygote.run(
        [f"sqlite:///{tmp_path}/mlruns/mlflow.db"], ROOT, cli_env(), timeout=120, code=code
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = done.stdout.split()[-1]
    assert store.get_run(run_id).data.tags[ghosts.PID] == ""  # an ended run names no process
    store.update_run(run_id, status="RUNNING")  # what mlflow.start_run(run_id=...) does
    assert ghosts.end_dead_runs(store, now=lambda: NOW) == []
    assert store.get_run(run_id).info.status == "RUNNING"


def test_a_process_whose_run_was_ended_elsewhere_stops_at_its_next_heartbeat_and_can_be_resumed(
    compose_cfg, store, monkeypatch, caplog
):
    # Issue 34, point 5: a run whose heartbeat went unseen for 15 minutes (a laptop asleep, Ctrl-Z) is
    # ended by a reaper elsewhere while its process lives; when it wakes, it stopped writing into an
    # ended run only when its run finished. Now its next heartbeat finds the run ended and stops it
    # as SIGTERM does: a checkpoint, the run resumable, every step once.
    from conftest import runs_of

    from seqlab.tracking import StepLog
    from seqlab.train import train

    monkeypatch.setattr(ghosts, "HEARTBEAT_EVERY_S", 0.2)
    args = ["data.n_samples=512", "trainer.max_epochs=6", "logger.system_metrics=false"]
    add = StepLog.add

    def ended_by_a_reaper_elsewhere(self, loss, step, lr):
        add(self, loss, step, lr)
        if step == 5:
            (run,) = runs_of(store, "seqlab")
            store.set_terminated(
                run.info.run_id, "KILLED"
            )  # what the reaper on another machine does
            time.sleep(1.5)  # this process goes on training meanwhile: a few beats

    monkeypatch.setattr(StepLog, "add", ended_by_a_reaper_elsewhere)
    with pytest.raises(SystemExit):
        train(compose_cfg(*args))
    monkeypatch.setattr(StepLog, "add", add)
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "KILLED" and "interrupted_at_step" in run.data.tags
    assert (
        f"run {run.info.run_id} was ended KILLED by another process while this one trained"
        in caplog.text
    )
    result = train(compose_cfg(*args, f"resume={run.info.run_id}"))
    assert result.status == "FINISHED" and store.get_run(run.info.run_id).info.status == "FINISHED"
    steps = [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] == 6 * 7
