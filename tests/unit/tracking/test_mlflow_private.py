"""tracking.mlflow_private: MLflow's internals as seqlab uses them."""

from __future__ import annotations

import logging

import mlflow
import numpy as np
import pytest
from mlflow.utils import requirements_utils

from seqlab.tracking import mlflow_private
from seqlab.tracking.mlflow_private import (
    given_requirements,
    link_model_metrics,
    serving_checked,
    serving_checked_once,
)


@pytest.fixture
def no_module_map(monkeypatch):
    """MLflow's module map unbuilt, and building it fails the test."""
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)

    def refuse():
        raise AssertionError("MLflow mapped every installed package")

    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions", refuse)


def test_given_requirements_are_checked_by_version_without_mapping_every_package(
    no_module_map, caplog
):
    given = [f"mlflow=={mlflow.__version__}", "numpy==0.0.1", "torch"]
    with caplog.at_level(logging.WARNING, logger="mlflow"), given_requirements(given):
        requirements_utils.warn_dependency_requirement_mismatches(given)
    # The check still tells a wrong version apart (numpy is not 0.0.1) and passes the right ones.
    assert "numpy==0.0.1" in caplog.text and "mlflow==" not in caplog.text
    # Nothing is left behind for MLflow's inference of another model's requirements.
    assert requirements_utils._MODULES_TO_PACKAGES is None


# Requirements given: MLflow's inference of them starts a process for each model (3-4 s here).
NUMPY = ["numpy"]


def test_a_module_map_built_before_is_left_as_it_is(monkeypatch):
    built = {"numpy": ["numpy"], "yaml": ["PyYAML"]}
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", built)
    with given_requirements(["numpy"]):
        assert requirements_utils._MODULES_TO_PACKAGES is built
    assert requirements_utils._MODULES_TO_PACKAGES is built


class _Doubled(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input * 2


def test_a_model_checked_already_is_logged_without_mlflows_serving_check(store, monkeypatch):
    """MLflow's log_model loads the model it has just written to predict its example; inside
    serving_checked it does not, and after it it does again (the check's own function back)."""
    loads = []
    load = mlflow.pyfunc.load_model
    monkeypatch.setattr(
        mlflow.pyfunc, "load_model", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    mlflow.set_tracking_uri(store.tracking_uri)
    try:
        with mlflow.start_run():
            example = np.ones((2, 3), dtype=np.float32)
            mlflow.pyfunc.log_model(
                name="checked",
                python_model=_Doubled(),
                input_example=example,
                pip_requirements=NUMPY,
            )
            assert len(loads) == 1  # MLflow's own check, as every flavor's log_model makes it
            with serving_checked():
                mlflow.pyfunc.log_model(
                    name="mine",
                    python_model=_Doubled(),
                    input_example=example,
                    pip_requirements=NUMPY,
                )
            assert len(loads) == 1
            mlflow.pyfunc.log_model(
                name="again", python_model=_Doubled(), input_example=example, pip_requirements=NUMPY
            )
            assert len(loads) == 2
    finally:
        mlflow.set_tracking_uri(None)


class _Refusing(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        raise ValueError("cannot serve")


def test_the_serving_check_runs_for_a_kinds_first_model_until_one_passes(store, monkeypatch):
    """serving_checked_once(kind): MLflow's check for the first model of its kind in the process;
    none for the next of that kind; a model that failed it leaves the next one checked."""
    monkeypatch.setattr(mlflow_private, "_SERVED", set())
    loads = []
    load = mlflow.pyfunc.load_model
    monkeypatch.setattr(
        mlflow.pyfunc, "load_model", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    example = np.ones((2, 3), dtype=np.float32)
    mlflow.set_tracking_uri(store.tracking_uri)
    try:
        with mlflow.start_run():
            for kind, model, checked in [
                ("a", _Refusing(), 1),  # checked; it fails (MLflow warns), so "a" is not served
                ("a", _Doubled(), 2),  # checked again: passes
                ("a", _Doubled(), 2),  # not checked
                ("b", _Doubled(), 3),  # another kind: checked
            ]:
                with serving_checked_once(kind):
                    mlflow.pyfunc.log_model(
                        name="m",
                        python_model=model,
                        input_example=example,
                        pip_requirements=NUMPY,
                    )
                assert len(loads) == checked, (kind, loads)
        assert mlflow_private._SERVED == {"a", "b"}
    finally:
        mlflow.set_tracking_uri(None)


def test_the_installed_versions_are_looked_up_once_inside_given_requirements():
    looked_up = requirements_utils._get_installed_version
    with given_requirements(["numpy"]):
        assert requirements_utils._get_installed_version("numpy") == looked_up("numpy")
        assert requirements_utils._get_installed_version is mlflow_private._installed_version
    assert requirements_utils._get_installed_version is looked_up


def test_a_models_metrics_go_into_a_sql_store_alone(store):
    """link_model_metrics: the model's rows, and no second copy of the run's own."""
    from mlflow.entities import Metric

    run = store.create_run(store.get_experiment_by_name("Default").experiment_id)
    run_id = run.info.run_id
    store.log_metric(run_id, "val_rmse", 0.5, timestamp=1000, step=3)
    model = store.create_logged_model(run.info.experiment_id, name="m", source_run_id=run_id)
    points = [Metric("val_rmse", 0.5, 1000, 3, model_id=model.model_id)]
    assert link_model_metrics(store, run_id, run.info.experiment_id, points)
    linked = store.get_logged_model(model.model_id).metrics
    assert [(m.key, m.value, m.step, m.run_id) for m in linked] == [("val_rmse", 0.5, 3, run_id)]
    assert [(m.step, m.value) for m in store.get_metric_history(run_id, "val_rmse")] == [(3, 0.5)]
    # A tracking server's client: the caller writes the rows with log_batch.
    assert not link_model_metrics(
        mlflow.MlflowClient("http://127.0.0.1:9"), run_id, run.info.experiment_id, points
    )
