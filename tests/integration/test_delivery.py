"""Every run's metrics through its journal and the one delivery process of its training process
(seqlab.delivery): every row arrives once, live, also when the helper dies or stalls, and a
run's status comes after its metrics."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cli_env
from harness.delivery import _series

from seqlab.tracking import MlflowTracker


def _helper(tracker):
    return tracker.sender.delivery.proc


def test_every_row_of_every_run_arrives_through_one_helper_process(tmp_path, store):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    first, second = MlflowTracker(uri, "writer"), MlflowTracker(uri, "writer")
    with first.run("a", {}), second.run("b", {}):
        proc = _helper(first)
        assert _helper(second) is proc and proc.poll() is None  # one live helper for both runs
        assert "mlflow.db" not in " ".join(proc.args)  # the address is not shown by ps
        for start in range(1, 3001, 500):
            first.log_series(*_series(start, 500))
            second.log_series(*_series(start, 250))
    assert proc.poll() is None  # it stays for the process's next runs
    for tracker, n in ((first, 3000), (second, 1500)):
        run = store.get_run(tracker.run_id)
        assert run.info.status == "FINISHED"
        history = store.get_metric_history(tracker.run_id, "train_loss")
        steps = [m.step for m in history]
        assert len(steps) == n and len(set(steps)) == n  # each step once
        assert len(store.get_metric_history(tracker.run_id, "lr")) == n
    assert [m.value for m in store.get_metric_history(first.run_id, "train_loss")] == [
        0.5 / s for s in range(1, 3001)
    ]
    assert [s for s, _ in first.history["train_loss"]] == list(range(1, 3001))  # for the plot too
    # the journals go once the store has them
    assert not first.sender.journal.folder.exists() and not second.sender.journal.folder.exists()


@pytest.mark.parametrize("where", ["sqlite", "server"])
def test_a_running_runs_rows_are_in_the_store_within_two_seconds(tmp_path, store, where, request):
    """Issue 33, point 5: live, as the UI and get_metric_history show it, without any wait by
    training: into a local store and to a tracking server alike."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    if where == "server":
        uri = request.getfixturevalue("mlflow_server").uri
        store = mlflow.MlflowClient(uri)
    tracker = MlflowTracker(uri, f"live-{tmp_path.name}")
    with tracker.run("r", {}):
        # The delivery process starts with the run (a Python process; for a server, MLflow's
        # client: seconds of CPU on a busy machine), which in training is seconds before its first
        # step (the model, the data, Lightning's set-up). Here the first row is logged at once, so
        # it waits for that start; the steps after it are held to the 2 s.
        tracker.log_series(*_series(1, 1))
        tracker.sync_metrics(idle=True)  # a server: waited for while it takes rows
        assert len(store.get_metric_history(tracker.run_id, "train_loss")) == 1
        for start in (2, 52, 102):
            tracker.log_series(*_series(start, 50))
            logged = time.monotonic()
            while len(store.get_metric_history(tracker.run_id, "train_loss")) < start + 49:
                assert time.monotonic() - logged < 2.0, "a journaled row was not live within 2 s"
                time.sleep(0.05)


@pytest.mark.parametrize("path", ["sqlite", "client"])
def test_odd_values_and_the_latest_value_are_stored_as_mlflow_stores_them(
    tmp_path, store, monkeypatch, path
):
    """NaN, infinities, a value logged twice, steps out of order: the same records through the
    plain-SQL path as through MLflow's own client."""
    if path == "client":
        monkeypatch.setenv("SEQLAB_DELIVERY_CLIENT", "1")
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    values = [0.5, float("nan"), float("inf"), -float("inf"), 0.25]
    with tracker.run("r", {}):
        tracker.log_series({"train_loss": values}, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
        # a repeat, and an older step
        tracker.log_series({"train_loss": [0.25, 0.75]}, [5, 3], [50, 35])
        tracker.log_metrics({"val_rmse": 0.3}, step=5)
    history = sorted(
        store.get_metric_history(tracker.run_id, "train_loss"), key=lambda m: (m.step, m.timestamp)
    )
    assert [(m.step, m.timestamp) for m in history] == [
        (1, 10),
        (2, 20),
        (3, 30),
        (3, 35),
        (4, 40),
        (5, 50),
    ]
    got = [m.value for m in history]
    assert got[0] == 0.5 and math.isnan(got[1]) and got[2] > 1e308 and got[4] < -1e308
    assert got[3] == 0.75
    run = store.get_run(tracker.run_id)
    # the latest step's value, as the runs table shows it
    assert run.data.metrics["train_loss"] == 0.25 and run.data.metrics["val_rmse"] == 0.3


# Issue 24, point 2 and issue 33: a helper that dies or stalls is found, and nothing is lost or doubled.
def test_a_helper_that_dies_is_replaced_and_goes_on_from_the_journal(tmp_path, store, caplog):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        tracker.log_series(*_series(1, 100))
        tracker.sync_metrics()
        dead = _helper(tracker)
        dead.kill()
        dead.wait()
        tracker.log_series(*_series(101, 100))  # found at this send, said in one line
        assert _helper(tracker) is not dead and _helper(tracker).poll() is None
        assert caplog.text.count("the delivery process stopped") == 1
        tracker.log_series(*_series(201, 10))
    steps = [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")]
    assert steps == list(range(1, 211))  # every step once: the new helper went on from the count
    assert store.get_run(tracker.run_id).info.status == "FINISHED"


def test_a_checkpoint_is_published_only_after_the_steps_before_it_are_stored(
    tmp_path, store, monkeypatch, caplog
):
    # A stalled helper: resume= continues after the checkpoint, so the steps before it must be in
    # the store first. Publishing waits for them, then writes them from this process.
    from seqlab.resume import points

    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    checkpoint = tmp_path / "interrupted.ckpt"
    checkpoint.write_bytes(b"state")
    monkeypatch.setattr(
        tracker, "sync_metrics", lambda timeout_s=2.0, f=tracker.sync_metrics: f(timeout_s)
    )
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        stalled = _helper(tracker)
        os.kill(stalled.pid, signal.SIGSTOP)
        tracker.log_series(*_series(1, 500))
        points.publish_resume_point(tracker, checkpoint, 500)
        steps = [m.step for m in store.get_metric_history(tracker.run_id, "train_loss")]
        assert steps == list(range(1, 501))
        assert store.get_run(tracker.run_id).data.tags[points.STOPPED_AT] == "500"
        assert stalled.poll() is not None and _helper(tracker).poll() is None  # replaced
        assert "did not deliver run" in caplog.text and "written from here" in caplog.text


def test_a_training_process_killed_outright_loses_no_journaled_row(tmp_path, store):
    """kill -9 of the training process: its helper delivers what the journal holds and ends; the
    run stays RUNNING until the reaper (the next command on the store) ends it KILLED."""
    from seqlab.store.ghosts import end_dead_runs

    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from seqlab.store.ghosts import identity\n"
        "from seqlab.tracking import MlflowTracker\n"
        "t = MlflowTracker(sys.argv[1], 'killed')\n"
        "t.start('r', identity(), journal_dir=Path(sys.argv[2]))\n"
        "t.log_series({'train_loss': [0.5 / s for s in range(1, 2001)]}, list(range(1, 2001)), list(range(1, 2001)))\n"
        "print(t.run_id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    proc = subprocess.run(
        [sys.executable, "-c", code, uri, str(tmp_path / "job")],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run_id = proc.stdout.split()[0]
    deadline = time.monotonic() + 30
    while len(store.get_metric_history(run_id, "train_loss")) < 2000:
        assert time.monotonic() < deadline, "the orphaned helper did not deliver the journal"
        time.sleep(0.1)
    assert store.get_run(run_id).info.status == "RUNNING"
    ended = dict(end_dead_runs(store))
    assert run_id in ended and store.get_run(run_id).info.status == "KILLED"
    steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
    assert steps == list(range(1, 2001))


def _curves_history(n: int = 3_000) -> dict:
    steps = list(range(1, n + 1))
    return {
        "train_rmse": [(s, 1.0 / s**0.5) for s in steps],
        "train_loss": [(s, 1.0 / s) for s in steps],
        "val_rmse": [(s, 0.9 / s**0.5) for s in steps[::300]],
        "val_loss": [(s, float("nan") if s == 301 else 0.8 / s) for s in steps[::300]],
        "lr": [(s, 1e-3 if s < n // 2 else 1e-4) for s in steps],
    }


def test_a_runs_figure_is_drawn_by_its_delivery_process_as_this_process_would_draw_it(
    tmp_path, monkeypatch
):
    """A run's training curves are drawn beside its models' logging, by the delivery process
    (delivery.figures): the same picture as this process draws, its series file gone after."""
    from matplotlib.image import imread

    from seqlab.delivery.figures import Curves
    from seqlab.plots import series_to_draw, training_curves

    history = _curves_history()
    here = training_curves(history, tmp_path / "here.png", "member 3")
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with tracker.run("r", {}):
        # This process cannot draw it: the picture that comes back is the helper's.
        monkeypatch.setattr(Curves, "draw", lambda self: pytest.fail("drawn in this process"))
        png = tmp_path / "job" / "training_curves.png"
        drawn = tracker.draw_curves(series_to_draw(history), png, "member 3").wait()
        monkeypatch.undo()
    assert drawn == png and np.array_equal(imread(png), imread(here))
    assert sorted(p.name for p in png.parent.iterdir()) == ["training_curves.png"]


def test_a_figure_the_helper_does_not_draw_is_drawn_here(tmp_path, caplog):
    """A helper that stalls, or dies before it draws: the run's figure is drawn in this process."""
    from matplotlib.image import imread

    from seqlab.plots import series_to_draw, training_curves

    history = _curves_history(400)
    here = imread(training_curves(history, tmp_path / "here.png"))
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "writer")
    with caplog.at_level(logging.WARNING, logger="seqlab"), tracker.run("r", {}):
        helper = _helper(tracker)
        for ending in ("stalled", "killed"):
            os.kill(helper.pid, signal.SIGSTOP)  # it takes no message until killed or let go
            png = tmp_path / ending / "training_curves.png"
            drawing = tracker.draw_curves(series_to_draw(history), png, "")
            started = time.monotonic()
            if ending == "killed":
                helper.kill()
                helper.wait()
            assert drawing.wait(wait_s=1.0) == png and np.array_equal(imread(png), here)
            assert time.monotonic() - started < 15  # no longer than the wait and a figure
            if ending == "stalled":
                os.kill(helper.pid, signal.SIGCONT)
        assert _helper(tracker) is not helper  # replaced as a dead helper always is
    assert "the delivery process stopped" in caplog.text
