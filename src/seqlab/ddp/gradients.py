"""The fused loop's gradients averaged over a DDP job's processes, by the loop itself.

DDP's reducer averages gradients inside each backward, but only after a forward of the wrapped
module, and it expects every parameter to get a gradient in each. The fused loop runs many steps in
one Lightning call, and its one-step shortcut (packing.model) leaves the LSTM's recurrent weights out
of the graph: the reducer refuses both ("parameters that were not used in producing the loss"). So
the loop steps inside DDP's `no_sync()` (the official way to skip the reducer; it just toggles
`require_backward_grad_sync`) and averages the gradients here, in one collective per step, where
the reducer would have: after the backward, before MATLAB's L2 and threshold, clipping and the
update. Every process then applies the same update to the same weights, as under DDP."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class AverageGradients:
    """Called with the loop's gradient tensors after each backward: each becomes the mean of every
    process's. One flat buffer, one all-reduce (a SUM: gloo has no AVG)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.flat: torch.Tensor | None = None

    def __call__(self, grads: list[torch.Tensor]) -> None:
        n = sum(g.numel() for g in grads)
        if self.flat is None or self.flat.numel() != n or self.flat.device != grads[0].device:
            self.flat = grads[0].new_empty(n)
        torch.cat([g.reshape(-1) for g in grads], out=self.flat)
        dist.all_reduce(self.flat)
        self.flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(self.flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def without_reducer(strategy_model: Any) -> ContextManager:
    """DDP's no_sync() on the wrapped module (its reducer stays out of the loop's backwards);
    nothing for one process."""
    if isinstance(strategy_model, DistributedDataParallel):
        return strategy_model.no_sync()
    return nullcontext()
