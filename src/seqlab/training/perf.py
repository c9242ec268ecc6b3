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


class DirectFusedStep:
    """torch.optim.Adam's or AdamW's fused step (fused=True) as torch.optim runs it (its state's
    step counts, then one fused kernel per parameter group), without the per-step Python around it:
    torch's step re-collects every parameter's state, checks and wraps it each time, about 150 us of
    a 1 ms step of the seed's network here, where the kernel takes 18 us (AMD EPYC). The same
    kernel with the same arguments: the same numbers to the bit. The first step goes through
    torch's own, which makes the state; the lists are taken from it then. Built where the training
    loop keeps its gradients as buffers (training.loop), so they stay the same tensors."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups: list[tuple[dict, list[list[torch.Tensor]]]] = []
        self.ids: list[tuple[int, ...]] = []  # each group's parameters, as the lists were taken

    @staticmethod
    def applies(optimizer: torch.optim.Optimizer) -> bool:
        """Adam or AdamW, fused, not made for a CUDA graph (that path replays its own capture),
        on one device, of real tensors."""
        if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
            return False
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return (
            bool(params)
            and all(
                g.get("fused") and not g.get("capturable") and not g.get("differentiable")
                for g in optimizer.param_groups
            )
            and len({(p.device, p.dtype) for p in params}) == 1
            and not any(torch.is_complex(p) for p in params)
        )

    def __call__(self) -> None:
        if not self._current():
            self.optimizer.step()  # torch's own step: it makes (or finds) each parameter's state
            self._collect()
            return
        for group, (params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps) in self.groups:
            torch._foreach_add_(steps, 1)
            # AdamW is Adam with decoupled_weight_decay=True in its groups (torch.optim.adamw)
            kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
            beta1, beta2 = group["betas"]
            kernel(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_sqs,
                steps,
                amsgrad=group["amsgrad"],
                lr=group["lr"],
                beta1=float(beta1),
                beta2=float(beta2),
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                grad_scale=None,
                found_inf=None,
            )

    def _current(self) -> bool:
        """Whether the lists taken are still the optimizer's (a resume loads new state tensors,
        Lightning may hand a parameter a new gradient tensor): else torch's step, then new lists."""
        if not self.groups or len(self.groups) != len(self.optimizer.param_groups):
            return False
        state = self.optimizer.state
        for (group, (params, grads, exp_avgs, *_)), ids, now in zip(
            self.groups, self.ids, self.optimizer.param_groups
        ):
            # load_state_dict makes new group dicts (it may keep the state's tensors)
            if now is not group or tuple(map(id, group["params"])) != ids or not params:
                return False
            if state[params[0]].get("exp_avg") is not exp_avgs[0]:
                return False
            if any(p.grad is not g for p, g in zip(params, grads)):
                return False
        return True

    def _collect(self) -> None:
        self.groups = []
        self.ids = [tuple(map(id, group["params"])) for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self.optimizer.state[p] for p in params]
            self.groups.append(
                (
                    group,
                    [
                        params,
                        [p.grad for p in params],
                        [s["exp_avg"] for s in states],
                        [s["exp_avg_sq"] for s in states],
                        [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [],
                        [s["step"] for s in states],
                    ],
                )
            )
