"""Issue 15, points 3 and 4: the time-based checkpoint (checkpoint.interval_s) that a run killed
with kill -9 continues from, and checkpoint writes that fail in one line and never leave a
truncated checkpoint behind."""

from __future__ import annotations

import shutil
import signal
import time

import pytest
from conftest import ROOT, cli_env, runs_of

import seqlab.train
from seqlab.train import train

# 410 training samples: 13 steps an epoch, in items of 5 steps (see test_robust's exact resume)
EXACT = [
    "data.n_samples=512",
    "data.batch_size=32",
    "trainer.max_epochs=4",
    "perf.steps_per_call=5",
    "deterministic=true",
    "checkpoint.interval_s=500",
]


def _load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.parametrize("trigger, saved_at", [(7, 10), (12, 13)], ids=["mid-epoch", "epoch-end"])
def test_a_time_based_checkpoint_holds_the_exact_training_state(
    compose_cfg, store, tmp_path, monkeypatch, trigger, saved_at
):
    """A fake clock passes interval_s during step `trigger`: the checkpoint is taken at the next step
    boundary (the next Lightning call), is the run's resume point while it trains, and training
    continued from it ends with the same weights as the run that never stopped."""
    from seqlab.resume import checkpoints, points
    from seqlab.tracking import StepLog

    now = [0.0]
    monkeypatch.setattr(checkpoints, "_clock", lambda: now[0])
    add = StepLog.add
    tags_at_checkpoint = {}
    publish = points.publish_resume_point

    def publish_and_look(tracker, path, step):
        publish(tracker, path, step)
        tags_at_checkpoint.update(store.get_run(tracker.run_id).data.tags)

    def add_then_tick(self, loss, step, lr):
        add(self, loss, step, lr)
        if step == trigger:
            now[0] += 1000.0

    monkeypatch.setattr(StepLog, "add", add_then_tick)
    monkeypatch.setattr(points, "publish_resume_point", publish_and_look)
    monkeypatch.setattr(
        seqlab.train, "publish_resume_point", publish_and_look
    )  # where the task looks it up
    train(compose_cfg(*EXACT))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    assert tags_at_checkpoint["interrupted_at_step"] == str(saved_at)  # resumable while it ran
    assert "interrupted_at_step" not in run.data.tags  # a finished run has nothing to continue
    local = tmp_path / "out" / "checkpoints" / "interrupted.ckpt"
    assert _load(local)["global_step"] == saved_at
    stored = store.download_artifacts(
        run.info.run_id, "checkpoints/interrupted.ckpt", str(tmp_path / "dl")
    )
    assert open(stored, "rb").read() == local.read_bytes()
    assert not list((tmp_path / "out" / "checkpoints").glob(".*.tmp"))
    shutil.copy(local, tmp_path / "timed.ckpt")
    shutil.copy(tmp_path / "out" / "checkpoints" / "last.ckpt", tmp_path / "uninterrupted.ckpt")

    monkeypatch.setattr(StepLog, "add", add)
    train(
        compose_cfg(
            *EXACT, f"ckpt_path={tmp_path / 'timed.ckpt'}", "logger.experiment_name=continued"
        )
    )
    a = _load(tmp_path / "uninterrupted.ckpt")["state_dict"]
    b = _load(tmp_path / "out" / "checkpoints" / "last.ckpt")["state_dict"]
    assert a.keys() == b.keys() and all(__import__("torch").equal(a[k], b[k]) for k in a)
    (continued,) = runs_of(store, "continued")
    steps = [m.step for m in store.get_metric_history(continued.info.run_id, "train_loss")]
    assert steps == list(range(saved_at + 1, 4 * 13 + 1))


# Started as `python -c FAULT MODE train.py ...` (a child of tests/zygote.py): train.py as the CLI runs it, with a fault at a known
# moment, whatever the machine's speed (its clock reads one second later at every Lightning call, so
# checkpoint.interval_s=2 is every other call): once the first time-based checkpoint is stored, the next one
# kills the process with SIGKILL before it writes ("kill"), or the process's file-size limit
# (RLIMIT_FSIZE) drops to N bytes, so that no file larger than that can be written any more
# ("fsize:N"): a disk that fills up mid-run, without root.
FAULT = """
import os, resource, runpy, signal, sys
mode = sys.argv.pop(1); sys.argv.pop(0)
from seqlab.resume import checkpoints, points
publish, save = points.publish_resume_point, checkpoints.save_checkpoint
published = []

def publish_then_fault(tracker, path, step):
    publish(tracker, path, step)
    published.append(step)
    if mode.startswith("fsize:") and len(published) == 1:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(mode[6:]), hard))

def save_or_die(trainer, path):
    if mode == "kill" and published and os.path.basename(str(path)) == "interrupted.ckpt":
        os.kill(os.getpid(), signal.SIGKILL)
    return save(trainer, path)

ticks = [0.0]

def one_second_per_read():  # read once per Lightning call: the checkpoints fall on known calls
    ticks[0] += 1.0
    return ticks[0]

points.publish_resume_point, checkpoints.save_checkpoint = publish_then_fault, save_or_die
import seqlab.train  # the task binds it at its import (the zygote made it): patched where it is looked up too
seqlab.train.publish_resume_point = publish_then_fault
checkpoints._clock = one_second_per_read
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run_with_fault(tmp_path, mode, *args, timeout=600):
    from harness import zygote

    return zygote.run(
        [mode, str(ROOT / "train.py"), *args, f"paths.root_dir={tmp_path}"],
        tmp_path,
        cli_env(),
        timeout=timeout,
        code=FAULT,
    )


# 820 training samples: 13 steps an epoch; metrics sent every 10-step call, so some steps after the
# checkpoint are stored before the kill, and a resume trains them again.
KILLABLE = [
    "data.n_samples=1024",
    "trainer.max_epochs=30",
    "perf.steps_per_call=10",
    "checkpoint.interval_s=2",
    "logger.flush_every_n_steps=10",
    "logger.flush_every_s=0",
]


def test_kill_9_after_a_time_based_checkpoint_then_resume_finishes_with_every_step_once(
    tmp_path, store, run_cli
):
    killed = _run_with_fault(tmp_path, "kill", *KILLABLE)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    (run,) = runs_of(store, "seqlab")
    run_id = run.info.run_id
    assert run.info.status == "RUNNING"  # what kill -9 leaves
    checkpoint_step = int(run.data.tags["interrupted_at_step"])
    # Steps after the checkpoint were stored, so the resume trains them again. The killed run's
    # delivery process outlives it: it delivers what the journal holds, then ends. Under load it
    # may not have done so when kill -9 returns, so wait for it (up to a minute).
    deadline = time.monotonic() + 60
    while True:
        steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
        if max(steps) > checkpoint_step or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert max(steps) > checkpoint_step, (checkpoint_step, max(steps))

    resumed = run_cli(*KILLABLE, f"resume={run_id}")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert (
        f"run {run_id}" in out and "was left RUNNING: process ended without closing the run" in out
    )
    run = store.get_run(run_id)
    assert run.info.status == "FINISHED"
    steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
    assert steps == list(range(1, 30 * 13 + 1))  # every step once: none lost, none stored twice
    val_steps = [m.step for m in store.get_metric_history(run_id, "val_rmse")]
    assert sorted(val_steps) == [13 * (e + 1) for e in range(30)]


def test_steps_not_yet_sent_at_a_time_based_checkpoint_are_sent_before_it(tmp_path, store, run_cli):
    # Metrics sent at most once every 1000 s: only the checkpoint itself sends the steps before it.
    # A kill -9 right after it, then resume: every step once (the steps before the checkpoint were
    # never sent again by the resume, which continues after it).
    args = [*KILLABLE[:-1], "logger.flush_every_s=1000"]
    killed = _run_with_fault(tmp_path, "kill", *args)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    (run,) = runs_of(store, "seqlab")
    resumed = run_cli(*args, f"resume={run.info.run_id}")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    steps = [m.step for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == list(range(1, 30 * 13 + 1))


# A checkpoint of this model is about 3.4 MB; the store (about 1 MB) and the other files stay below the limit.
FULL_DISK = [
    "data.n_samples=1024",
    "trainer.max_epochs=8",
    "model.hidden_size=256",
    "checkpoint.interval_s=2",
    "perf.steps_per_call=5",
]


def test_a_checkpoint_write_that_fails_ends_the_run_killed_in_one_line_and_keeps_the_last_good_one(
    tmp_path, store, run_cli
):
    failed = _run_with_fault(tmp_path, f"fsize:{2_500_000}", *FULL_DISK)
    out = failed.stdout + failed.stderr
    checkpoints = next((tmp_path / "logs" / "runs").glob("*")) / "checkpoints"
    assert failed.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert errors == [
        f"error: could not write {checkpoints / 'interrupted.ckpt'}: File too large; free space there "
        "(or lift the file-size limit, or make the folder writable), or write elsewhere "
        "(paths.log_dir, paths.mlruns_dir)"
    ], out[-3000:]
    assert "Traceback" not in out
    (run,) = runs_of(store, "seqlab")
    run_id = run.info.run_id
    assert (
        run.info.status == "KILLED"
    )  # issue 34, point 7: resumable once there is room, as a resumed sweep continues it
    assert run.data.tags["failure_reason"].startswith(
        f"could not write {checkpoints / 'interrupted.ckpt'}"
    )
    assert not list(checkpoints.glob(".*.tmp"))  # no part of a checkpoint left behind
    last_good = int(run.data.tags["interrupted_at_step"])  # still the resume point...
    stored = store.download_artifacts(run_id, "checkpoints/interrupted.ckpt", str(tmp_path / "dl"))
    assert _load(stored)["global_step"] == last_good  # ...and whole
    assert _load(checkpoints / "interrupted.ckpt")["global_step"] == last_good
    steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
    assert (
        steps == list(range(1, steps[-1] + 1)) and steps[-1] > last_good
    )  # no metric sent was lost

    resumed = run_cli(*FULL_DISK, f"resume={run_id}")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert store.get_run(run_id).info.status == "FINISHED"
    steps = [m.step for m in store.get_metric_history(run_id, "train_loss")]
    assert steps == list(range(1, 8 * 13 + 1))
    assert len(store.get_metric_history(run_id, "val_rmse")) == 8
