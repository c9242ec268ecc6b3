"""Checkpoints as MLflow 3 logged models (logger.log_checkpoints=best|all|none): the run's Models
tab lists them with their step and the validation metrics of that step, and predict.py takes one
by its models:/m-<id> URI."""

from __future__ import annotations

import numpy as np
import pytest
from harness.run_to_use import _cli, _new_data, _pyfunc

from seqlab.train import train

# A learning rate high enough that validation gets worse after its best (deterministic on CPU):
# val_rmse is lowest at step 16 of 24, so the best network is not the last one.
OVERSHOOT = [
    "data.n_samples=256",
    "trainer.max_epochs=6",
    "optimizer.lr=0.05",
    "deterministic=true",
    "logger.system_metrics=false",
]


def _models(store, run):
    found = store.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id='{run.info.run_id}'"
    )
    return sorted(found, key=lambda m: (m.name, m.creation_timestamp))


def _linked(model) -> dict[str, tuple[int, float]]:
    return {m.key: (m.step, m.value) for m in model.metrics or []}


def test_the_best_networks_checkpoint_is_a_logged_model_that_predict_takes(
    compose_cfg, store, tmp_path
):
    result = train(compose_cfg(*OVERSHOOT))  # logger.log_checkpoints=best: the default
    run = store.get_run(result.run_id)
    best_step, last_step = (
        int(run.data.metrics["best_val_rmse_step"]),
        int(run.data.tags["output_network_step"]),
    )
    assert best_step < last_step, "the scenario: the best validation is not the last"
    best, model = _models(store, run)  # by name: checkpoint-best, model
    assert (best.name, best.tags["checkpoint"], model.name) == ("checkpoint-best", "best", "model")
    # Each with its step's validation metrics, as the run's Models tab ranks them.
    assert _linked(best)["val_rmse"] == (
        best_step,
        pytest.approx(run.data.metrics["best_val_rmse"]),
    )
    assert _linked(model)["val_rmse"][0] == last_step
    assert {o.model_id: o.step for o in run.outputs.model_outputs} == {
        best.model_id: best_step,
        model.model_id: last_step,
    }

    x, y = _new_data()
    path = tmp_path / "new.npz"
    np.savez(path, X=x, y=y)
    done = _cli(tmp_path, f"model=models:/{best.model_id}", "data=npz", f"data.path={path}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    out = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("outputs"))
    with np.load(f"{out}/predictions.npz") as saved:
        expected = _pyfunc(tmp_path, f"models:/{best.model_id}").predict(x)
        np.testing.assert_allclose(saved["predictions"], expected, rtol=1e-5, atol=1e-6)
        last = _pyfunc(tmp_path, f"models:/{model.model_id}").predict(x)
        assert not np.allclose(saved["predictions"], last)  # the best network, not the last one


def test_all_logs_a_network_at_each_new_best_and_none_only_the_one_kept(compose_cfg, store):
    result = train(compose_cfg(*OVERSHOOT, "logger.log_checkpoints=all"))
    run = store.get_run(result.run_id)
    improvements = [int(m.step) for m in store.get_metric_history(run.info.run_id, "best_val_rmse")]
    models = _models(store, run)
    checkpoints = [m for m in models if m.name == "checkpoint"]
    assert (
        sorted(_linked(m)["val_rmse"][0] for m in checkpoints) == improvements
    )  # once per checkpoint, not per step
    assert {m.name for m in models} == {"checkpoint", "checkpoint-best", "model"}

    result = train(
        compose_cfg(*OVERSHOOT, "logger.log_checkpoints=none", "logger.experiment_name=none")
    )
    run = store.get_run(result.run_id)
    assert [m.name for m in _models(store, run)] == ["model"]


def test_a_kept_best_network_is_the_best_checkpoint_itself(compose_cfg, store):
    result = train(compose_cfg(*OVERSHOOT, "module.output_network=best"))
    run = store.get_run(result.run_id)
    (model,) = _models(store, run)  # no second copy of the same network
    assert model.name == "model" and model.tags["checkpoint"] == "best"
    assert _linked(model)["val_rmse"][0] == int(run.data.metrics["best_val_rmse_step"])


def test_each_member_of_a_pack_logs_its_own_best_checkpoint(run_cli, store):
    proc = run_cli("-m", "seed=0,1", "pack=2", *OVERSHOOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    members = [
        r
        for r in store.search_runs([store.get_experiment_by_name("seqlab").experiment_id])
        if "pack_id" in r.data.tags
    ]
    assert len(members) == 2
    separate = 0
    for run in members:
        best_step, last_step = (
            int(run.data.metrics["best_val_rmse_step"]),
            int(run.data.tags["output_network_step"]),
        )
        models = _models(store, run)
        (best,) = [m for m in models if m.tags.get("checkpoint") == "best"]
        assert _linked(best)["val_rmse"] == (
            best_step,
            pytest.approx(run.data.metrics["best_val_rmse"]),
        )
        assert best.name == ("model" if best_step == last_step else "checkpoint-best")
        separate += best.name == "checkpoint-best"
    assert separate >= 1  # seed 0 trains as alone above: best at step 16 of 24
