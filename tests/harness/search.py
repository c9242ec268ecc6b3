"""What the tests in `integration/test_search.py` and `integration/test_search_workers.py` share
(under tests/)."""

from __future__ import annotations

from pathlib import Path

from conftest import runs_of
from omegaconf import OmegaConf

TINY = ["data.n_samples=256", "trainer.max_epochs=2", "logger.system_metrics=false"]


def _preset(tmp_path: Path, sweeper: dict) -> list[str]:
    """A search preset of the test's own, beside the project's configs."""
    folder = tmp_path / "conf" / "hparams_search"
    folder.mkdir(parents=True, exist_ok=True)
    body = OmegaConf.create(
        {
            "defaults": [{"override /hydra/sweeper": "seqlab_optuna"}],
            "hydra": {"sweeper": {"storage": "${paths.optuna_storage}", **sweeper}},
        }
    )
    (folder / "test.yaml").write_text("# @package _global_\n" + OmegaConf.to_yaml(body))
    return ["--config-dir", str(tmp_path / "conf"), "hparams_search=test"]


def _study(tmp_path: Path):
    """The one study of a test's search, as its storage holds it."""
    import optuna

    storage = f"sqlite:///{tmp_path}/mlruns/optuna.db"
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def _parent_and_trials(store):
    """The sweep's parent runs, and the trials' runs in trial order."""
    runs = runs_of(store, "seqlab")
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    trials = [r for r in runs if "optuna_trial" in r.data.tags]
    return parents, sorted(trials, key=lambda r: int(r.data.tags["optuna_trial"]))
