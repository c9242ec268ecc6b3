"""The sweeper's config node, registered as `hydra/sweeper=seqlab_optuna` when Hydra scans its plugins."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class SamplerConf:
    name: str = "tpe"  # tpe | random
    seed: Optional[int] = None  # null: a different search each time
    n_startup_trials: int = 10  # tpe: random trials before its model of the space takes over


@dataclass
class PrunerConf:
    name: str = "median"  # median | hyperband | none
    # median: a trial is stopped when its val_rmse at an epoch is worse than the median of the
    # trials before it at that epoch, once n_startup_trials trials have finished, after n_warmup_steps epochs.
    n_startup_trials: int = 5
    n_warmup_steps: int = 1
    # hyperband: epochs a trial gets at least, at most, and the fraction kept at each rung.
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3


@dataclass
class SeqlabOptunaSweeperConf:
    _target_: str = "hydra_plugins.seqlab_optuna_sweeper.sweeper.SeqlabOptunaSweeper"
    objective: str = "best_val_rmse"  # best_val_rmse | final_val_rmse, minimised
    n_trials: int = 20  # in total: a rerun of the same command continues the study up to this many
    n_jobs: Optional[int] = (
        None  # trials launched at once; null: as many as the launcher runs side by side
    )
    study_name: Optional[str] = (
        None  # null: named for the experiment and a hash of the command and space
    )
    storage: Optional[str] = (
        None  # an SQLAlchemy URL (the preset: paths.optuna_storage), or journal:///path/file.log; the jobs reach their trials through it
    )
    # Many workers on one study (the same command run N times): each renews its trials' heartbeat
    # every heartbeat_interval s; a trial silent for grace_period s (its worker died) fails and its
    # values run again. Database storages only (Optuna's journal files have no heartbeat).
    heartbeat_interval: int = 30
    grace_period: int = 120
    # With pack=N: a member that ends before its pack (pruned, diverged) gives its slot to the
    # next trial the study asks for, inside the running pack (seqlab.sweeps.refill). Its trials
    # must differ in packable keys only (not the seed), with one validation an epoch and no scheduler.
    refill: bool = False
    sampler: SamplerConf = field(default_factory=SamplerConf)
    pruner: PrunerConf = field(default_factory=PrunerConf)
    # config key -> {type: float|int|categorical, low, high, log, step | choices}, or a list of choices
    params: Dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(
    group="hydra/sweeper", name="seqlab_optuna", node=SeqlabOptunaSweeperConf, provider="seqlab"
)
