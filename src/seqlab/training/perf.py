"""The training loop's speed settings (conf/perf/): which optimizer implementation, how many
optimizer steps per Lightning call, and the Lightning flags that go with a perf option. The math
is the same whichever is chosen; tests/integration/test_perf.py checks that."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import torch

log = logging.getLogger("seqlab")


def optimizer_factory(
    partial: Callable[..., torch.optim.Optimizer], impl: str, capturable: bool = False
) -> Callable[..., torch.optim.Optimizer]:
    """Wrap an optimizer partial so it is built fused (one kernel for every parameter's update)
    or foreach (a few kernels over all parameters) where the class and device support it, and
    as it is otherwise. 'default' leaves the choice to PyTorch. `capturable`: for CUDA graphs,
    the optimizer keeps its state and learning rate in device tensors."""
    if impl == "default" and not capturable:
        return partial

    def build(params: Any) -> torch.optim.Optimizer:
        params = list(params)
        if capturable:
            for extra in ({"fused": True} if impl == "fused" else {}, {}):
                try:
                    optimizer = partial(params=params, capturable=True, **extra)
                except (TypeError, RuntimeError, ValueError):
                    continue
                device = params[0].device
                for group in optimizer.param_groups:
                    # A scheduler updates a tensor learning rate in place, so replays see it.
                    group["lr"] = torch.tensor(float(group["lr"]), device=device)
                return optimizer
            # Not capturable (SGD, say): the module sees it and trains eagerly.
            log.info(
                "perf      %s cannot run inside a CUDA graph: training eagerly", _name(partial)
            )
        if impl == "fused":
            try:
                return partial(params=params, fused=True)
            except (TypeError, RuntimeError, ValueError) as error:
                log.info(
                    "perf      fused %s not available here (%s): using foreach",
                    _name(partial),
                    error,
                )
        try:
            return partial(params=params, foreach=True)
        except (TypeError, RuntimeError, ValueError):
            return partial(params=params)

    return build


def _name(partial: Any) -> str:
    func = getattr(partial, "func", partial)
    return getattr(func, "__name__", str(func))


def steps_per_call(wanted: int, batches_per_epoch: int, val_check_interval: Any) -> tuple[int, Any]:
    """The fused loop's steps per Lightning call, and trainer.val_check_interval in calls.

    A call holds at most an epoch's batches. Lightning counts calls, not steps, when it places
    validation inside or across epochs (val_check_interval = N iterations, or a fraction f of
    an epoch, i.e. round(f * batches) iterations): then every call must hold the same number of
    steps, a divisor of both the epoch's batches and N."""
    if (
        val_check_interval is None
        or val_check_interval == 1.0
        and isinstance(val_check_interval, float)
    ):
        return max(min(wanted, batches_per_epoch), 1), val_check_interval
    steps = val_check_interval
    if isinstance(val_check_interval, float):
        steps = max(round(val_check_interval * batches_per_epoch), 1)
    k = max(math.gcd(math.gcd(wanted, batches_per_epoch), int(steps)), 1)
    return k, int(steps) // k
