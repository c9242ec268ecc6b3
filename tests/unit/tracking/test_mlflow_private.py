"""tracking.mlflow_private: MLflow's internals as seqlab uses them."""

from __future__ import annotations

import logging

import mlflow
import pytest
from mlflow.utils import requirements_utils

from seqlab.tracking.mlflow_private import given_requirements


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
