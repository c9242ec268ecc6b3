"""Hydra's Sweeper API in front of `seqlab.sweeps.search`: Hydra builds this from `hydra.sweeper`, hands it
the launcher's context, and calls `sweep` with the command line's overrides."""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# Registers the config node, also when this module is imported before Hydra's plugin scan.
from hydra_plugins.seqlab_optuna_sweeper import config as _config  # noqa: F401


class SeqlabOptunaSweeper(Sweeper):
    def __init__(
        self,
        objective: str,
        n_trials: int,
        sampler: DictConfig,
        pruner: DictConfig,
        params: DictConfig,
        n_jobs: Optional[int] = None,
        study_name: Optional[str] = None,
        storage: Optional[str] = None,
        heartbeat_interval: int = 30,
        grace_period: int = 120,
        refill: bool = False,
    ) -> None:
        self.settings = dict(
            objective=objective,
            n_trials=n_trials,
            n_jobs=n_jobs,
            study_name=study_name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            params=params,
            heartbeat=(heartbeat_interval, grace_period),
            refill=refill,
        )
        self.hydra_context: Optional[HydraContext] = None
        self.config: Optional[DictConfig] = None
        self.launcher = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> Any:
        from seqlab.sweeps.search import (  # Optuna: only once a search runs (Hydra imports every plugin)
            Search,
        )

        return Search(self, arguments, **self.settings).run()
