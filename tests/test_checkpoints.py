"""Issue 15, points 3 and 4: the time-based checkpoint (checkpoint.interval_s) that a run killed
with kill -9 continues from, and checkpoint writes that fail in one line and never leave a
truncated checkpoint behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, runs_of
from seqlab.train import train

# 410 training samples: 13 steps an epoch, in items of 5 steps (see test_robust's exact resume)
EXACT = ["data.n_samples=512", "data.batch_size=32", "trainer.max_epochs=4", "perf.steps_per_call=5",
         "deterministic=true", "checkpoint.interval_s=500"]


def _load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("trigger, saved_at", [(7, 10), (12, 13)], ids=["mid-epoch", "epoch-end"])
def test_a_time_based_checkpoint_holds_the_exact_training_state(compose_cfg, store, tmp_path, monkeypatch,
                                                                 trigger, saved_at):
    """A fake clock passes interval_s during step `trigger`: the checkpoint is taken at the next step
    boundary (the next Lightning call), is the run's resume point while it trains, and training
    continued from it ends with the same weights as the run that never stopped."""
    from seqlab import checkpoints
    from seqlab.tracking import StepLog

    now = [0.0]
    monkeypatch.setattr(checkpoints, "_clock", lambda: now[0])
    add = StepLog.add
    tags_at_checkpoint = {}
    publish = checkpoints.publish_resume_point

    def publish_and_look(tracker, path, step):
        publish(tracker, path, step)
        tags_at_checkpoint.update(store.get_run(tracker.run_id).data.tags)

    def add_then_tick(self, loss, step, lr):
        add(self, loss, step, lr)
        if step == trigger:
            now[0] += 1000.0

    monkeypatch.setattr(StepLog, "add", add_then_tick)
    monkeypatch.setattr(checkpoints, "publish_resume_point", publish_and_look)
    train(compose_cfg(*EXACT))
    (run,) = runs_of(store, "seqlab")
    assert run.info.status == "FINISHED"
    assert tags_at_checkpoint["interrupted_at_step"] == str(saved_at)  # resumable while it ran
    assert "interrupted_at_step" not in run.data.tags  # a finished run has nothing to continue
    local = tmp_path / "out" / "checkpoints" / "interrupted.ckpt"
    assert _load(local)["global_step"] == saved_at
    stored = store.download_artifacts(run.info.run_id, "checkpoints/interrupted.ckpt", str(tmp_path / "dl"))
    assert open(stored, "rb").read() == local.read_bytes()
    assert not list((tmp_path / "out" / "checkpoints").glob(".*.tmp"))
    shutil.copy(local, tmp_path / "timed.ckpt")
    shutil.copy(tmp_path / "out" / "checkpoints" / "last.ckpt", tmp_path / "uninterrupted.ckpt")

    monkeypatch.setattr(StepLog, "add", add)
    train(compose_cfg(*EXACT, f"ckpt_path={tmp_path / 'timed.ckpt'}", "logger.experiment_name=continued"))
    a = _load(tmp_path / "uninterrupted.ckpt")["state_dict"]
    b = _load(tmp_path / "out" / "checkpoints" / "last.ckpt")["state_dict"]
    assert a.keys() == b.keys() and all(__import__("torch").equal(a[k], b[k]) for k in a)
    (continued,) = runs_of(store, "continued")
    steps = [m.step for m in store.get_metric_history(continued.info.run_id, "train_loss")]
    assert steps == list(range(saved_at + 1, 4 * 13 + 1))
