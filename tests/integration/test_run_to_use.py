"""From run to use: the trained network as an MLflow model (pyfunc, registry), with the data it
was trained on recorded as dataset inputs. One short training run serves every test here."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pytest
import torch
from conftest import CONF_DIR, TINY, compose_in, runs_of
from harness.run_to_use import _cli, _new_data, _pyfunc
from hydra import compose, initialize_config_dir

from seqlab.hydra_version import VERSION_BASE
from seqlab.model import CNNLSTM
from seqlab.train import train

REGISTERED = "seqlab-load"


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
    # (and its ONNX copy, model-onnx: tests/integration/test_onnx.py)
    logged = {m.name: m for m in client.search_logged_models([run.info.experiment_id])}
    assert set(logged) == {"model", "model-onnx"} and logged["model"].source_run_id == result.run_id

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
    again = train(
        compose_in(
            root,
            "data.n_samples=128",
            "trainer.max_epochs=1",
            f"logger.register_as={REGISTERED}",
            f"paths.output_dir={tmp_path}/again",
        )
    )
    assert again.model_uri == f"models:/{REGISTERED}/2"
    versions = {
        str(v.version): v.run_id for v in client.search_model_versions(f"name='{REGISTERED}'")
    }
    assert versions == {"1": result.run_id, "2": again.run_id}
    assert client.get_run(again.run_id).data.tags["registered_model"] == f"models:/{REGISTERED}/2"


def test_an_unregistered_run_has_its_model_under_runs_and_links_to_the_model_training_view(
    compose_cfg, store, caplog
):
    caplog.set_level("INFO", logger="seqlab")
    result = train(compose_cfg("data.n_samples=128", "trainer.max_epochs=1"))
    assert result.model_uri == f"runs:/{result.run_id}/model"
    (run,) = runs_of(store, "seqlab")
    assert "registered_model" not in run.data.tags
    assert store.search_registered_models() == []
    # the experiment is marked as model training, and the printed link opens that view
    experiment = store.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    link = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs/{result.run_id}?workflowType=machine_learning"
    assert f"see it: make ui, then {link}" in caplog.text
    assert f"python predict.py run={result.run_id} data=..." in caplog.text


def test_the_training_and_validation_data_are_the_run_s_dataset_inputs(trained):
    root, result, client = trained
    inputs = client.get_run(result.run_id).inputs.dataset_inputs
    by_context = {
        next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs
    }
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
    np.savez(
        path,
        X=rng.normal(size=(96, 3, 4)).astype(np.float32),
        y=rng.normal(size=96).astype(np.float32),
    )
    result = train(
        compose_cfg("data=npz", f"data.path={path}", "trainer.max_epochs=1", "data.batch_size=32")
    )
    inputs = store.get_run(result.run_id).inputs.dataset_inputs
    names = {i.dataset.name: i.dataset for i in inputs}
    assert set(names) == {"own-train", "own-val"}
    assert names["own-train"].source_type == "local"
    assert json.loads(names["own-train"].source)["uri"] == str(path)
    assert json.loads(names["own-val"].profile)["features_shape"] == [19, 3, 4]


def _compose_predict(root, out, *overrides):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose(
            "predict", overrides=[f"paths.root_dir={root}", f"paths.output_dir={out}", *overrides]
        )


def test_predict_cli_on_npz_writes_predictions_and_an_evaluation_run(trained, tmp_path):
    root, result, client = trained
    x, y = _new_data()
    path = tmp_path / "new.npz"
    np.savez(path, X=x, y=y)
    done = _cli(root, f"run={result.run_id}", "data=npz", f"data.path={path}")
    assert done.returncode == 0, done.stderr[-2000:]
    out = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("outputs"))
    expected = _pyfunc(root, f"runs:/{result.run_id}/model").predict(x)
    table = np.loadtxt(f"{out}/predictions.csv", delimiter=",", skiprows=1)
    assert open(f"{out}/predictions.csv").readline().strip() == "prediction,target"
    np.testing.assert_allclose(table[:, 0], expected[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table[:, 1], y[:, 0], rtol=1e-6)
    with np.load(f"{out}/predictions.npz") as saved:
        np.testing.assert_allclose(saved["predictions"], expected, rtol=1e-5, atol=1e-6)

    (evaluation,) = client.search_runs(
        [client.get_run(result.run_id).info.experiment_id],
        f"tags.training_run_id = '{result.run_id}'",
    )
    assert evaluation.info.status == "FINISHED"
    assert evaluation.data.tags["mlflow.parentRunId"] == result.run_id
    rmse = float(np.sqrt(((expected - y) ** 2).mean()))
    assert evaluation.data.metrics["rmse"] == pytest.approx(rmse, rel=1e-4)
    assert evaluation.data.metrics["mae"] == pytest.approx(
        float(np.abs(expected - y).mean()), rel=1e-4
    )
    assert evaluation.data.metrics["n_samples"] == 48
    files = {f.path for f in client.list_artifacts(evaluation.info.run_id)}
    assert {"predictions.csv", "predictions.npz", "predicted_vs_actual.png"} <= files
    (data_input,) = evaluation.inputs.dataset_inputs
    assert data_input.dataset.name == "new" and json.loads(data_input.dataset.profile)[
        "features_shape"
    ] == [48, 1, 1440]
    assert f"evaluation run {evaluation.info.run_id}" in done.stdout
    assert f"/runs/{evaluation.info.run_id}?workflowType=machine_learning" in done.stdout


def test_predict_on_csv_and_mat_by_registered_version(trained, tmp_path):
    from harness.matfiles import write_v5

    from seqlab.predict import predict

    root, result, client = trained
    x, y = _new_data(n=20, seed=3)
    expected = _pyfunc(root, f"models:/{REGISTERED}/1").predict(x)
    csv = tmp_path / "new.csv"
    np.savetxt(csv, np.concatenate([x[:, 0, :], y], axis=1), delimiter=",")
    mat = tmp_path / "new.mat"
    write_v5(mat, {"XrTrain": x[:, 0, :].astype(np.float64), "YrTrain": y.astype(np.float64)})
    for data in (["data=csv", f"data.path={csv}"], ["data=mat", f"data.path={mat}"]):
        done = predict(
            _compose_predict(
                root, tmp_path / data[0].split("=")[1], f"model_uri=models:/{REGISTERED}/1", *data
            )
        )
        assert done.training_run_id == result.run_id
        table = np.loadtxt(done.csv, delimiter=",", skiprows=1)
        np.testing.assert_allclose(table[:, 0], expected[:, 0], rtol=1e-5, atol=1e-5)
        assert done.metrics["rmse"] == pytest.approx(
            float(np.sqrt(((expected - y) ** 2).mean())), rel=1e-4
        )
        assert client.get_run(done.run_id).data.tags["model_uri"] == f"models:/{REGISTERED}/1"
    # a comparison of the experiment's runs leaves the evaluation runs out
    from seqlab.sweeps.runs import find_runs

    compared = {r.info.run_id for r in find_runs(client, "seqlab")[0]}
    assert result.run_id in compared and done.run_id not in compared


def test_predict_without_targets_writes_predictions_only(trained, tmp_path):
    from seqlab.predict import predict

    root, result, client = trained
    x, _ = _new_data(n=10)
    path = tmp_path / "inputs_only.npz"
    np.savez(path, X=x)
    done = predict(
        _compose_predict(
            root, tmp_path / "out", f"run={result.run_id}", "data=npz", f"data.path={path}"
        )
    )
    assert done.metrics == {} and done.run_id is None
    assert open(done.csv).readline().strip() == "prediction"
    assert np.loadtxt(done.csv, skiprows=1).shape == (10,)


@pytest.mark.parametrize("case", ["unknown run", "wrong shape"])
def test_predict_cli_bad_input_is_one_line(trained, tmp_path, case):
    root, result, client = trained
    if case == "unknown run":
        args, message = (
            ["run=0123456789abcdef0123456789abcdef"],
            "error: run=0123456789abcdef0123456789abcdef: no such run",
        )
    else:
        path = tmp_path / "narrow.npz"
        np.savez(path, X=np.zeros((8, 1, 100), np.float32), y=np.zeros(8, np.float32))
        args = [
            f"model=models:/{REGISTERED}/1",
            "data=npz",
            f"data.path={path}",
        ]  # model=: model_uri's short form
        message = "error: data: the model takes inputs of (samples, steps, features) = (N, 1, 1440), and npz has (N, 1, 100)"
    done = _cli(root, *args)
    assert done.returncode == 1
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert "Traceback" not in done.stderr


def test_predict_with_a_run_without_a_model_is_one_line(tmp_path, compose_cfg, store, caplog):
    from seqlab import SeqlabError
    from seqlab.predict import main

    with pytest.raises(SeqlabError):  # a run that fails before training: it has no model
        train(
            compose_cfg("data.n_samples=128", "module.output_network=best", "data.val_fraction=0")
        )
    (failed,) = runs_of(store, "seqlab")
    cfg = _compose_predict(tmp_path, tmp_path / "p", f"run={failed.info.run_id}")
    with pytest.raises(SystemExit) as stop:
        main(cfg)
    assert stop.value.code == 1
    assert f"error: run={failed.info.run_id} (FAILED) has no model" in caplog.text


# -- serving ------------------------------------------------------------------------------------
def test_mlflow_models_serve_answers_a_post_with_the_predictions(trained, tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests

    root, result, client = trained
    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bin_dir = str(Path(sys.executable).parent)  # mlflow starts uvicorn from PATH
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlruns/mlflow.db",
    }
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(
        [
            str(Path(bin_dir) / "mlflow"),
            "models",
            "serve",
            "-m",
            f"runs:/{result.run_id}/model",
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the model server did not start in 180 s"
            time.sleep(0.5)
        x = _inputs(n=3, seed=11)
        answer = requests.post(
            f"http://127.0.0.1:{port}/invocations", json={"inputs": x.tolist()}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        expected = _pyfunc(root, f"runs:/{result.run_id}/model").predict(x)
        np.testing.assert_allclose(
            np.asarray(answer.json()["predictions"]), expected, rtol=1e-5, atol=1e-6
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the uvicorn it started
        server.wait(timeout=30)
        log.close()


def test_against_a_server_the_model_registers_and_the_only_link_opens_the_runs(
    compose_cfg, tmp_path, caplog, capfd, mlflow_server
):
    # The session's server (tests/conftest.py), in an experiment and a registered model of this test's own.
    server, name = mlflow_server, f"served-{tmp_path.name}"
    caplog.set_level("INFO", logger="seqlab")
    result = train(
        compose_cfg(
            "data.n_samples=128",
            "trainer.max_epochs=1",
            f"logger.tracking_uri={server.uri}",
            f"logger.experiment_name={name}",
            f"logger.register_as={name}",
        )
    )
    client = mlflow.MlflowClient(server.uri)
    assert result.model_uri == f"models:/{name}/1"
    assert [(str(v.version), v.run_id) for v in client.search_model_versions(f"name='{name}'")] == [
        ("1", result.run_id)
    ]
    experiment = client.get_experiment_by_name(name)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    link = f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{result.run_id}?workflowType=machine_learning"
    assert f"see it: {link}" in caplog.text
    assert (
        "View run" not in capfd.readouterr().out
    )  # MLflow's own links, without the view, are not printed


def test_predict_finds_a_runs_model_among_more_than_a_page_of_models(trained, tmp_path):
    """Issue 34, point 4: MLflow answers a search of logged models a page (100) at a time, and one
    sweep=device_batch logs 630 in its experiment; predict.py run= said "has no model" for a run
    whose model was not on the first page."""
    root, result, _ = trained
    (tmp_path / "mlruns").mkdir(exist_ok=True)
    shutil.copy(
        root / "mlruns" / "mlflow.db", tmp_path / "mlruns" / "mlflow.db"
    )  # the artifacts stay where they are
    store = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = store.get_run(result.run_id).info.experiment_id
    for _ in range(100):  # newer models of other runs: the first page
        store.create_logged_model(
            experiment, name="model", source_run_id=store.create_run(experiment).info.run_id
        )
    x, _ = _new_data(8)
    path = tmp_path / "new.npz"
    np.savez(path, X=x)
    done = _cli(tmp_path, f"run={result.run_id}", "data=npz", f"data.path={path}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("outputs"))
    assert len(np.loadtxt(f"{out}/predictions.csv", delimiter=",", skiprows=1, ndmin=1)) == 8
