"""Builds the `callbacks` config group (conf/callbacks/) into Lightning callbacks."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from omegaconf import DictConfig


def build(nodes: DictConfig, **objects: Any) -> dict[str, Any]:
    """Each entry in order, by its `_target_`. A partial gets, from `objects` and the entries built
    before it (by name), the arguments its constructor names and the config did not give: so a
    callback asks for the tracker or the timer in its signature, and nothing is set on it later."""
    from hydra.utils import instantiate

    built: dict[str, Any] = {}
    for name, node in nodes.items():
        if node is None:
            continue
        made = instantiate(node)
        if isinstance(made, functools.partial):
            available = {**objects, **built}
            wanted = [p for p in inspect.signature(made).parameters if p in available and p not in made.keywords]
            made = made(**{p: available[p] for p in wanted})
        built[name] = made
    return built
