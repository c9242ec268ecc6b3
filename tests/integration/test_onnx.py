"""The network kept, also as ONNX (logger.log_onnx, tracking/onnx_model.py): logged beside the
PyTorch model as `model-onnx`, predicting what the network predicts (onnxruntime, max abs
difference <= 1e-5), for the seed's one-step shape and for long sequences, and taken by predict.py."""

from __future__ import annotations

import logging

import numpy as np
from harness.run_to_use import _cli, _new_data

from seqlab.tracking import model_logging
from seqlab.tracking.onnx_model import TOLERANCE
from seqlab.train import train


def _models(store, run_id: str) -> dict[str, object]:
    run = store.get_run(run_id)
    found = store.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id='{run_id}'"
    )
    return {m.name: m for m in found}


def _predictions(root, *args) -> np.ndarray:
    done = _cli(root, *args)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    out = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("outputs"))
    with np.load(f"{out}/predictions.npz") as saved:
        return saved["predictions"]


def test_a_finished_run_logs_its_network_as_onnx_that_predicts_as_the_pytorch_model(
    run_cli, store, tmp_path
):
    done = run_cli("data.n_samples=256", "trainer.max_epochs=2")
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = next(
        line.split()[2] for line in done.stdout.splitlines() if line.startswith("mlflow    run")
    )
    models = _models(store, run_id)
    onnx_model, model = models["model-onnx"], models["model"]
    assert (
        onnx_model.tags["onnx_opset"] == "17"
        and "LSTM" in onnx_model.tags["onnx_operators"].split()
    )
    assert onnx_model.tags["onnx_of"] == model.model_id and "checkpoint" not in onnx_model.tags
    # Linked to the run at the kept network's step, with that step's validation metrics, as `model` is.
    assert {m.key: m.step for m in onnx_model.metrics}["val_rmse"] == {
        m.key: m.step for m in model.metrics
    }["val_rmse"]
    assert "also as ONNX (opset 17" in done.stdout

    # predict.py takes it: new data (48 samples, a batch size the export never saw) predicted by
    # onnxruntime as the PyTorch model predicts it.
    x, y = _new_data()
    path = tmp_path / "new.npz"
    np.savez(path, X=x, y=y)
    by_onnx = _predictions(
        tmp_path, f"model_uri=runs:/{run_id}/model-onnx", "data=npz", f"data.path={path}"
    )
    by_torch = _predictions(tmp_path, f"run={run_id}", "data=npz", f"data.path={path}")
    assert by_onnx.shape == by_torch.shape == (48, 1)
    assert np.abs(by_onnx - by_torch).max() <= TOLERANCE


def test_an_export_that_predicts_otherwise_is_not_logged_and_the_run_still_finishes(
    compose_cfg, store, monkeypatch, caplog
):
    monkeypatch.setattr(model_logging, "TOLERANCE", -1.0)  # every export "differs"
    with caplog.at_level(logging.WARNING, logger="seqlab"):
        result = train(
            compose_cfg("data.n_samples=128", "trainer.max_epochs=1", "logger.log_onnx=true")
        )
    assert result.status == "FINISHED" and store.get_run(result.run_id).info.status == "FINISHED"
    assert set(_models(store, result.run_id)) == {"model"}
    assert any(
        "not logged as ONNX: onnxruntime's predictions differ" in r.getMessage()
        for r in caplog.records
    )


def test_log_onnx_false_logs_the_pytorch_model_only(compose_cfg, store):
    result = train(
        compose_cfg("data.n_samples=128", "trainer.max_epochs=1")
    )  # compose_cfg: logger.log_onnx=false
    assert set(_models(store, result.run_id)) == {"model"}
