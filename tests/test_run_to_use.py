"""From run to use: the trained network as an MLflow model (pyfunc, registry), with the data it
was trained on recorded as dataset inputs. One short training run serves every test here."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import CONF_DIR, TINY, runs_of
from seqlab.model import CNNLSTM
from seqlab.train import train

REGISTERED = "seqlab-load"


def compose_in(root, *overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[f"paths.root_dir={root}", f"paths.output_dir={root}/out", *overrides])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _empty_store):
    """One short run, registered as version 1 of REGISTERED: (its folder, result, client)."""
    root = tmp_path_factory.mktemp("trained")
    (root / "mlruns").mkdir()
    shutil.copy(_empty_store, root / "mlruns" / "mlflow.db")
    result = train(compose_in(root, *TINY, f"logger.register_as={REGISTERED}"))
    return root, result, mlflow.MlflowClient(f"sqlite:///{root}/mlruns/mlflow.db")


def _inputs(n=5, seed=1):
    return np.random.default_rng(seed).normal(size=(n, 1, 1440)).astype(np.float32)


def test_the_pyfunc_model_predicts_what_the_checkpoint_does(trained):
    root, result, client = trained
    assert result.model_uri == f"models:/{REGISTERED}/1"
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    # Logged under the run's `model` path, in the run's own experiment (the Models tab)
    (logged,) = client.search_logged_models([run.info.experiment_id])
    assert logged.name == "model" and logged.source_run_id == result.run_id

    mlflow.set_tracking_uri(f"sqlite:///{root}/mlruns/mlflow.db")
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    spec = model.metadata.signature.inputs.inputs[0]
    assert spec.shape == (-1, 1, 1440)
    assert model.metadata.get_input_schema() is not None

    ckpt = torch.load(root / "out" / "checkpoints" / "last.ckpt", weights_only=False)
    net = CNNLSTM(n_features=1440)
    net.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    x = _inputs()
    with torch.no_grad():
        expected = net.eval()(torch.from_numpy(x)).numpy()
    got = model.predict(x)
    assert got.shape == (5, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.ptp(got) > 0  # different inputs, different predictions


def test_registering_again_makes_version_2(trained, tmp_path):
    root, result, client = trained
    again = train(compose_in(root, "data.n_samples=128", "trainer.max_epochs=1", f"logger.register_as={REGISTERED}",
                             f"paths.output_dir={tmp_path}/again"))
    assert again.model_uri == f"models:/{REGISTERED}/2"
    versions = {str(v.version): v.run_id for v in client.search_model_versions(f"name='{REGISTERED}'")}
    assert versions == {"1": result.run_id, "2": again.run_id}
    assert client.get_run(again.run_id).data.tags["registered_model"] == f"models:/{REGISTERED}/2"


def test_an_unregistered_run_has_its_model_under_runs(compose_cfg, store):
    result = train(compose_cfg("data.n_samples=128", "trainer.max_epochs=1"))
    assert result.model_uri == f"runs:/{result.run_id}/model"
    (run,) = runs_of(store, "seqlab")
    assert "registered_model" not in run.data.tags
    assert store.search_registered_models() == []


def test_the_training_and_validation_data_are_the_run_s_dataset_inputs(trained):
    root, result, client = trained
    inputs = client.get_run(result.run_id).inputs.dataset_inputs
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs}
    assert set(by_context) == {"training", "validation"}
    train_set, val_set = by_context["training"], by_context["validation"]
    assert (train_set.name, val_set.name) == ("synthetic-train", "synthetic-val")
    # TINY: 256 samples, 20% held out
    assert json.loads(train_set.profile)["features_shape"] == [205, 1, 1440]
    assert json.loads(val_set.profile)["targets_shape"] == [51, 1]
    assert train_set.digest and val_set.digest and train_set.digest != val_set.digest
    source = json.loads(train_set.source)["tags"]
    assert train_set.source_type == "code"
    assert source["generator"] == "seqlab.data.synthetic_daily_load" and source["seed"] == "0"
    assert source["n_samples"] == "256" and source["n_features"] == "1440"


def test_a_file_s_dataset_source_is_its_path(compose_cfg, store, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "own.npz"
    np.savez(path, X=rng.normal(size=(96, 3, 4)).astype(np.float32), y=rng.normal(size=96).astype(np.float32))
    result = train(compose_cfg("data=npz", f"data.path={path}", "trainer.max_epochs=1", "data.batch_size=32"))
    inputs = store.get_run(result.run_id).inputs.dataset_inputs
    names = {i.dataset.name: i.dataset for i in inputs}
    assert set(names) == {"own-train", "own-val"}
    assert names["own-train"].source_type == "local"
    assert json.loads(names["own-train"].source)["uri"] == str(path)
    assert json.loads(names["own-val"].profile)["features_shape"] == [19, 3, 4]
