"""What the tests in `integration/test_search.py` and `integration/test_search_workers.py` share
(under tests/)."""

from __future__ import annotations

from pathlib import Path

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
