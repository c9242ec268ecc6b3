"""A search space checked against the training config it samples, before anything trains: each key
is one the config has (a config group searched by its options' names), each end of each range and
every choice composes a config that passes validation, and the config's own values, where they lie
inside the space, make trial 0. (Reading hydra.sweeper.params and the command line's sweeps into
distributions: seqlab.sweeps.space; the search that uses both: seqlab.sweeps.search.)"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

import optuna
from omegaconf import DictConfig, OmegaConf

from seqlab import SeqlabError, one_line
from seqlab.sweeps import optuna_private
from seqlab.sweeps.study import SearchError, override_value, overrides_for
from seqlab.validation import validate

_MISSING = object()  # OmegaConf.select's answer for a key the config does not have


def check_against_config(
    space: Mapping[str, optuna.distributions.BaseDistribution],
    config: DictConfig,
    compose: Callable[[Sequence[str]], DictConfig],
    swept_here: Collection[str],
) -> None:
    """SearchError, named where the user wrote the entry (`swept_here`: the command line's keys), for
    a key the config (the sweeper's, `config`) does not have or a value that makes no valid config;
    `compose`: a job's config from a trial's overrides, as the launcher composes it."""
    groups = set(config.hydra.runtime.choices.keys())
    for key, distribution in space.items():
        if key.startswith("hydra.") or "/" in key:
            raise SearchError(
                f"{_where(key, swept_here)}: only keys of the training config can be searched"
            )
        if key in groups:
            if not isinstance(distribution, optuna.distributions.CategoricalDistribution):
                raise SearchError(
                    f"{_where(key, swept_here)}: {key} is a config group: search it with type: categorical "
                    "and option names as choices"
                )
            continue
        if OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False) is _MISSING:
            parent = key.rpartition(".")[0]
            raise SearchError(
                f"{_where(key, swept_here)}: {key} is not a config key"
                + (
                    f" ({parent} has: {', '.join(_keys(config, parent))})"
                    if parent and _keys(config, parent)
                    else ""
                )
            )
    _compose_extremes(space, compose, swept_here)


def _where(key: str, swept_here: Collection[str]) -> str:
    """Where the user wrote a key's entry, for an error: the command line, or the preset's params."""
    return key if key in swept_here else f"hydra.sweeper.params.{key}"


def _keys(config: DictConfig, parent: str) -> list[str]:
    node = OmegaConf.select(config, parent, default=None)
    return sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []


def _compose_extremes(
    space: Mapping[str, Any],
    compose: Callable[[Sequence[str]], DictConfig],
    swept_here: Collection[str],
) -> None:
    """Every trial's config must compose and pass the schema's checks: each key is tried at
    both ends of its range and at every choice, the rest as the command gives them, as a job
    would compose it, so that a bad value is named before anything trains."""

    for key, d in space.items():
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            values = [("a choice", c) for c in d.choices]
        else:
            values = [("low", d.low), ("high", d.high)]
        for what, value in values:
            override = overrides_for({key: value})[0]
            try:
                cfg = compose([override])
                validate(cfg)
            except SeqlabError as error:
                message = one_line(error)
            except Exception as error:  # Hydra's composition and OmegaConf's type errors
                message = one_line(error).split(" full_key:")[0]
            else:
                continue
            raise SearchError(
                f"{_where(key, swept_here)}: {override} ({what}) does not make a valid config: {message}"
            )


def starting_point(
    space: Mapping[str, optuna.distributions.BaseDistribution], config: DictConfig
) -> tuple[dict[str, Any], list[str]]:
    """Trial 0: the config's own value of each key the space holds (a group's: its option's name),
    and, as `key=value` overrides, those of its values that lie outside the space."""
    start, outside = {}, []
    for key, distribution in space.items():
        value = _starting_value(config, key)
        if optuna_private.contains(distribution, value):
            start[key] = value
        else:
            outside.append(f"{key}={override_value(value)}")
    return start, outside


def _starting_value(config: DictConfig, key: str) -> Any:
    choices = config.hydra.runtime.choices
    if key in choices:
        return choices[key]
    return OmegaConf.select(config, key)
