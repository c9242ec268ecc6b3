"""Packs that never idle (hydra.sweeper.refill=true, issue 36 point 4), through the real CLI: a
pruned member's slot goes to the study's next trial inside the running pack, which trains as that
trial alone would; the study's n_trials are reached with no trial lost or run twice."""

from __future__ import annotations

import numpy as np
from harness.search import TINY, _parent_and_trials, _preset, _study

# 1024 samples, 819 for training at batch 64: 13 steps an epoch (the last one short), 65 in the
# 5 epochs of each trial.
SHAPE = [
    "optimizer.lr=0.01",
    "data.n_samples=1024",
    "trainer.max_epochs=5",
    "scheduler=none",
    "logger.system_metrics=false",
    "logger.log_onnx=false",
]


def _history(store, run, key="train_loss"):
    points = sorted(store.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
    return [m.step for m in points], np.array([m.value for m in points])


def test_a_packs_freed_slots_train_the_next_trials_each_as_it_would_train_alone(
    run_cli, store, tmp_path
):
    # pack=2: the search asks trials 0 (the config's own lr, 0.01) and 1 (1e-7, the sampler's
    # seed) and launches them as one pack. Each member's trial is told as its run ends, so the
    # pack's job, asking the study itself, goes on: at epoch 5 both finish and trials 2 and 3
    # take their slots; the median pruner stops both (1e-7: worse than the median of trials 0
    # and 1) at their first epoch, the pack's sixth, and trials 4 and 5 (0.01) take the pruned
    # members' slots and train their own 5 epochs, to the pack's eleventh. n_trials=6: no more.
    preset = _preset(
        tmp_path,
        {
            "n_trials": 6,
            "refill": True,
            "sampler": {"name": "random", "seed": 5},
            "pruner": {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
            "params": {"optimizer": {"lr": {"type": "categorical", "choices": [0.01, 1.0e-7]}}},
        },
    )
    proc = run_cli("-m", *preset, "pack=2", *SHAPE)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    for line in (
        "refill    trial 2 takes member 0's slot (trial-0, FINISHED) at epoch 5",
        "refill    trial 3 takes member 1's slot (trial-1, FINISHED) at epoch 5",
        "refill    trial 4 takes member 0's slot (trial-2, pruned) at epoch 6",
        "refill    trial 5 takes member 1's slot (trial-3, pruned) at epoch 6",
        "pruned    trial 2 (member 0) at epoch 1 of 5",
    ):
        assert line in out, out[-4000:]

    # Every trial of the study ran once, each its own run under the sweep's parent, told as it ended.
    study = _study(tmp_path)
    states = {t.number: t.state.name for t in study.trials}
    assert states == {
        0: "COMPLETE",
        1: "COMPLETE",
        2: "PRUNED",
        3: "PRUNED",
        4: "COMPLETE",
        5: "COMPLETE",
    }
    (parent,), trials = _parent_and_trials(store)
    assert [t.data.tags["optuna_trial"] for t in trials] == [str(n) for n in range(6)]
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials)
    assert all(t.info.status == "FINISHED" for t in trials)
    assert [t.data.tags["trial_state"] for t in trials] == [states[n] for n in range(6)]
    assert [t.data.tags.get("refilled_slot_of") for t in trials] == [
        None,
        None,
        "trial-0",
        "trial-1",
        "trial-2",
        "trial-3",
    ]
    assert {t.data.tags["pack_id"] for t in trials} == {trials[0].data.tags["pack_id"]}
    assert [t.data.tags["pack_member"] for t in trials] == ["0", "1"] * 3

    # Each run counts its own steps and epochs: steps 1..65 once each, five validations, five
    # epochs; a pruned one its first epoch's 13.
    for t in trials:
        steps, _ = _history(store, t)
        full = t.data.tags["trial_state"] == "COMPLETE"
        assert steps == list(range(1, 66 if full else 14)), t.info.run_name
        assert _history(store, t, "val_rmse")[0] == ([13, 26, 39, 52, 65] if full else [13])
        assert len(store.get_metric_history(t.info.run_id, "epoch_time_s")) == (5 if full else 1)

    # Trial 4 trains as its job alone would (its overrides, one process): losses to rtol 1e-4.
    lr = trials[4].data.params["optimizer.lr"]
    alone = run_cli(*SHAPE, f"optimizer.lr={lr}", "logger.run_name=alone")
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-3000:]
    (single,) = [
        r for r in store.search_runs([parent.info.experiment_id]) if r.info.run_name == "alone"
    ]
    _, mine = _history(store, trials[4])
    _, its = _history(store, single)
    np.testing.assert_allclose(mine[:50], its[:50], rtol=1e-4)
    # Its validations too, to the packed validation's own arithmetic (a pack's first members differ
    # from their jobs alone by as much: 3.4e-4 measured on this shape; 4.3e-4 at the first epoch
    # since the synthetic data is drawn by torch, 2026-12-05, while the losses still agree to 1e-4).
    np.testing.assert_allclose(
        _history(store, trials[4], "val_rmse")[1], _history(store, single, "val_rmse")[1], atol=1e-3
    )


def test_a_search_that_cannot_refill_says_why_in_one_line_before_anything_trains(run_cli, store):
    # Through the CLI once (the other reasons: tests/unit/sweeps/test_refill.py): the preset's
    # space also searches model.hidden_size, a shape.
    proc = run_cli(
        "-m",
        "hparams_search=optuna",
        "hydra.sweeper.refill=true",
        "pack=4",
        "scheduler=none",
        "hydra.sweeper.params.data.batch_size=null",
        *TINY,
    )
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == [
        "error: hydra.sweeper.refill=true: trials take each other's slots, so they may differ only in "
        "optimizer.lr, module.l2_regularization, model.dropout, module.gradient_threshold; "
        "model.hidden_size is searched (leave it out with hydra.sweeper.params.model.hidden_size=null, "
        "or refill=false)"
    ]
    _, trials = _parent_and_trials(store)
    assert trials == []
