"""From run to use: the trained network as an MLflow model (pyfunc, registry), with the data it
was trained on recorded as dataset inputs. One short training run serves every test here."""

from __future__ import annotations

import numpy as np
import pytest
from harness.run_to_use import _cli


def test_an_experiment_made_before_is_marked_as_model_training_once(store):
    from seqlab.tracking import ensure_experiment

    old = store.create_experiment("made-before")
    assert ensure_experiment(store, "made-before", None) == old
    assert store.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    store.set_experiment_tag(
        old, "mlflow.experimentKind", "genai_development"
    )  # a user's own choice stays
    ensure_experiment(store, "made-before", None)
    assert store.get_experiment(old).tags["mlflow.experimentKind"] == "genai_development"


def test_predict_cli_misspelled_key_and_missing_model_are_one_line(tmp_path):
    done = _cli(tmp_path, "rnu=0123")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: rnu is not a config key; did you mean run? (the keys are: data, evaluate, experiment_name, "
        "model_uri, paths, run, seed, tracking_uri, hydra)"
    ]
    done = _cli(tmp_path, "data=npz")
    assert done.returncode == 1
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == [
        "error: say which model: run=RUN_ID (a training run's) or model=models:/NAME/VERSION, one of them"
    ]


def test_links_leave_out_credentials():
    from seqlab.store.ui import run_link

    assert (
        run_link("3", "abc", base="https://me:secret@mlflow.example.org/")
        == "https://mlflow.example.org/#/experiments/3/runs/abc?workflowType=machine_learning"
    )


def test_a_registered_name_with_a_slash_is_one_line(compose_cfg):
    from seqlab.schema import ConfigError
    from seqlab.validation import validate

    with pytest.raises(
        ConfigError, match=r"^logger.register_as must be a model name without '/'.*got 'a/b'$"
    ):
        validate(compose_cfg("logger.register_as=a/b"))


def test_two_jobs_logging_the_same_dataset_at_once_both_record_it():
    """The race a parallel sweep hits: MLflow's store looks a dataset up, then inserts it; the
    slower of two jobs breaks the unique key. It then finds the dataset and records its input."""
    from mlflow.exceptions import MlflowException
    from omegaconf import OmegaConf

    from seqlab.tracking.datasets import dataset, log_inputs

    calls = []

    class RacingClient:
        def log_inputs(self, run_id, datasets):
            calls.append((run_id, [d.dataset.name for d in datasets]))
            if len(calls) == 1:
                raise MlflowException(
                    "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                    "datasets.name, datasets.digest"
                )

    cfg = OmegaConf.create(
        {"name": "npz", "path": "/data/x.npz", "source": {"_target_": "seqlab.data.load_npz"}}
    )
    ds = dataset(cfg, np.zeros((4, 1, 3), np.float32), np.zeros((4, 1), np.float32), "npz-train")
    log_inputs(RacingClient(), "run1", [(ds, "training")])
    assert calls == [("run1", ["npz-train"]), ("run1", ["npz-train"])]

    class BrokenClient:
        def log_inputs(self, run_id, datasets):
            raise MlflowException("something else")

    with pytest.raises(MlflowException, match="something else"):
        log_inputs(BrokenClient(), "run1", [(ds, "training")])
