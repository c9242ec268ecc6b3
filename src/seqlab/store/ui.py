"""Where the MLflow UI opens. MLflow 3's UI shows an experiment as a GenAI experiment (its traces
overview) unless told otherwise: the experiment's `mlflow.experimentKind` tag says what kind it is
(the UI's values: custom_model_development for model training, genai_development), and a link's
`workflowType=machine_learning` opens the model-training view, whatever the browser last used.
Light: imported on the CLI's start-up path."""

from __future__ import annotations

import re

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
WORKFLOW = "workflowType=machine_learning"
UI_ADDRESS = "http://127.0.0.1:5000"  # make ui


def experiments_link(base: str = UI_ADDRESS) -> str:
    """The list of experiments, in the model-training view (make ui prints it)."""
    return f"{base}/#/experiments?{WORKFLOW}"


def experiment_link(experiment_id: str, base: str = UI_ADDRESS) -> str:
    """The experiment's runs table."""
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKFLOW}"


def run_link(experiment_id: str, run_id: str, base: str = UI_ADDRESS) -> str:
    """A run's page; `base` a server's address (any user:password@ in it is left out)."""
    base = re.sub(r"//[^/@\s]+@", "//", base.rstrip("/"))
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}"
