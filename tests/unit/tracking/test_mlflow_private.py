"""tracking.mlflow_private: MLflow's internals as seqlab uses them."""

from __future__ import annotations

import logging

import mlflow
import numpy as np
import pytest
from mlflow.utils import requirements_utils

from seqlab.tracking.mlflow_private import given_requirements, serving_checked


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
            mlflow.pyfunc.log_model(name="checked", python_model=_Doubled(), input_example=example)
            assert len(loads) == 1  # MLflow's own check, as every flavor's log_model makes it
            with serving_checked():
                mlflow.pyfunc.log_model(name="mine", python_model=_Doubled(), input_example=example)
            assert len(loads) == 1
            mlflow.pyfunc.log_model(name="again", python_model=_Doubled(), input_example=example)
            assert len(loads) == 2
    finally:
        mlflow.set_tracking_uri(None)
