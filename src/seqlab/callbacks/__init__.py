"""The `callbacks` config group (conf/callbacks/): `build` turns it into Lightning callbacks, and
the modules here are its options:

- `timing`:         honest epoch throughput (device-synchronised, validation left out); time to target
- `progress`:       the progress line
- `best`:           best_val_rmse and the step and epoch it was reached
- `output_network`: module.output_network (last|best) and validation_patience: the network kept, early stopping

The training loop's own callbacks live with what they serve: the step clock and recorder in
`seqlab.tracking`, the graceful stop and the time-based checkpoint in `seqlab.resume`, a trial's
reports in `seqlab.sweeps.pruning`, the rank watch in `seqlab.ddp`."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from seqlab import SeqlabError


def build(nodes: DictConfig, **objects: Any) -> dict[str, Any]:
    """Each entry in order, by its `_target_`. A partial gets, from `objects` and the entries built
    before it (by name), the arguments its constructor names and the config did not give: so a
    callback asks for the tracker or the timer in its signature, and nothing is set on it later."""

    built: dict[str, Any] = {}
    for name, node in nodes.items():
        if node is None:
            continue
        made = instantiate(node)
        if isinstance(made, functools.partial):
            available = {**objects, **built}
            params = inspect.signature(made).parameters
            missing = [
                p
                for p, spec in params.items()
                if spec.default is inspect.Parameter.empty
                and spec.kind is not inspect.Parameter.VAR_KEYWORD
                and p not in available
            ]
            if missing:
                raise SeqlabError(
                    f"callbacks.{name} needs {missing[0]!r}, which no callback above it is named and "
                    f"the run does not provide: keep callbacks.{missing[0]}, or switch off callbacks.{name}"
                )
            made = made(
                **{p: available[p] for p in params if p in available and p not in made.keywords}
            )
        built[name] = made
    return built
