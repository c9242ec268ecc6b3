"""Per-member training settings of a pack: each member's own learning rate (Adam, SGDM, RMSProp as
conf/optimizer/ configures them: `packed_optimizer`), and MATLAB's
coupled L2 and gradient threshold computed member by member (seqlab.training.gradients does them
for one network). Every tensor here carries the member dimension first, so a setting is a (K,)
tensor, viewed as (K, 1, ...) against a parameter; nothing loops over members in Python.

One fused Adam over the packed tensors already equals K Adams when the members share one learning
rate (Adam is elementwise); `PackedAdam` is for members that do not."""

from __future__ import annotations

import functools
import math
from typing import Iterable, Optional, Sequence

import torch
from torch import nn

from seqlab import SeqlabError
from seqlab.schema import ThresholdMethod, choice


def per_member(values: Sequence[Optional[float]], like: torch.Tensor, missing: float) -> torch.Tensor:
    """A (K,) tensor of a setting, on `like`'s device; a member without one gets `missing`."""
    return torch.tensor([missing if v is None else float(v) for v in values], dtype=like.dtype, device=like.device)


def _along(values: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """(K,) -> (K, 1, ..., 1): one value per member, broadcast over a packed tensor."""
    return values.view(-1, *([1] * (tensor.dim() - 1)))


class _PackedOptimizer(torch.optim.Optimizer):
    """An optimizer over packed parameters with a learning rate per member: member k steps with
    group["lr"] x group["member_lr"][k]. group["lr"] starts at 1 and is what a torch scheduler
    changes (a scalar, as schedulers expect), so a schedule (StepLR: MATLAB's piecewise drop)
    scales every member's own rate by the same factor, as each member's run alone would. No
    weight decay: MATLAB's L2 is coupled into the gradient before the step (PackedGradientTreatment)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: Sequence[float], **defaults: float) -> None:
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} needs parameters")
        if any(p.shape[0] != len(lr) for p in params):
            raise ValueError(f"every packed parameter's first dimension must be the {len(lr)} members")
        super().__init__(params, dict(lr=1.0, member_lr=per_member(lr, params[0], math.nan), **defaults))

    @staticmethod
    def _rate(group: dict, p: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return _along(group["lr"] * group["member_lr"] * scale, p)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch.optim's signature
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(group, p, self.state[p])
        return loss

    def _update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        raise NotImplementedError


class PackedAdam(_PackedOptimizer):
    """torch.optim.Adam's update (no amsgrad), member by member, with foreach kernels over all
    parameters at once (its step replaces the base class's per-parameter one)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: Sequence[float], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr, betas=betas, eps=eps)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch.optim's signature
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            grads, m, v = [p.grad for p in params], [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m.append(state["exp_avg"])
                v.append(state["exp_avg_sq"])
            step = self.state[params[0]]["step"]
            torch._foreach_lerp_(m, grads, 1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
            denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, math.sqrt(1 - beta2 ** step))
            torch._foreach_add_(denom, group["eps"])
            for p, exp_avg, d in zip(params, m, denom):
                p.sub_(self._rate(group, p, 1 / (1 - beta1 ** step)) * exp_avg / d)
        return loss


class PackedSGDM(_PackedOptimizer):
    """torch.optim.SGD's update with momentum (no dampening, no Nesterov), member by member."""

    def __init__(self, params: Iterable[nn.Parameter], lr: Sequence[float], momentum: float = 0.9) -> None:
        super().__init__(params, lr, momentum=momentum)

    def _update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = p.grad.clone()  # torch's first step: the gradient itself
        else:
            state["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
        p.sub_(self._rate(group, p) * state["momentum_buffer"])


class PackedRMSProp(_PackedOptimizer):
    """torch.optim.RMSprop's update (not centered, no momentum), member by member."""

    def __init__(self, params: Iterable[nn.Parameter], lr: Sequence[float], alpha: float = 0.99, eps: float = 1e-8) -> None:
        super().__init__(params, lr, alpha=alpha, eps=eps)

    def _update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        if not state:
            state["square_avg"] = torch.zeros_like(p)
        square_avg = state["square_avg"].mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
        p.sub_(self._rate(group, p) * p.grad / square_avg.sqrt().add_(group["eps"]))


# The config's optimizer class -> its packed form and the settings it carries over.
_PACKED = {
    torch.optim.Adam: (PackedAdam, ("betas", "eps"), {"amsgrad": False, "maximize": False}),
    torch.optim.SGD: (PackedSGDM, ("momentum",), {"dampening": 0, "nesterov": False, "maximize": False}),
    torch.optim.RMSprop: (PackedRMSProp, ("alpha", "eps"), {"centered": False, "momentum": 0, "maximize": False}),
}


def packed_optimizer(partial: functools.partial, params: Iterable[nn.Parameter], lr: Sequence[float]) -> _PackedOptimizer:
    """The packed form of the config's optimizer (a `_partial_` of torch.optim.Adam, SGD or
    RMSprop: conf/optimizer/), each member with its own learning rate; a setting it cannot pack
    is one line naming it."""
    found = _PACKED.get(partial.func)
    if found is None:
        raise SeqlabError(f"optimizer {partial.func.__name__} cannot be packed: pack=off, or optimizer=adam|sgdm|rmsprop")
    cls, carried, required = found
    given = partial.keywords
    if given.get("weight_decay", 0.0):
        raise SeqlabError("optimizer.weight_decay cannot be packed: MATLAB's L2 is module.l2_regularization; "
                          "set optimizer.weight_decay=0")
    for key, value in required.items():
        if key in given and given[key] != value:
            raise SeqlabError(f"optimizer.{key}={given[key]} cannot be packed (only {value}): pack=off to train it")
    return cls(params, lr, **{key: given[key] for key in carried if key in given})


class PackedGradientTreatment:
    """MATLAB's coupled L2 (gradient += l2 * w on weights and BatchNorm scale/offset, never biases)
    and gradient threshold, each member with its own factor and threshold (None: none), with the
    threshold method all members share (it is a shape of the computation, not a setting)."""

    def __init__(self, l2_params: Sequence[nn.Parameter], params: Sequence[nn.Parameter], l2: Sequence[float],
                 threshold: Sequence[Optional[float]], method: str = "l2norm") -> None:
        self.method = choice(ThresholdMethod, method, "module.gradient_threshold_method")
        self.params, self.l2_params = list(params), list(l2_params)
        self.l2 = per_member(l2, self.params[0], 0.0)
        self.threshold = per_member(threshold, self.params[0], math.inf)
        self.active_l2 = bool(self.l2.any())
        self.active_threshold = bool(torch.isfinite(self.threshold).any())

    @torch.no_grad()
    def __call__(self) -> None:
        if self.active_l2:
            for p in self.l2_params:
                if p.grad is not None:
                    p.grad.add_(_along(self.l2, p) * p)
        if not self.active_threshold:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.method == "absolute-value":
            for g in grads:
                bound = _along(self.threshold, g)
                torch.clamp(g, -bound, bound, out=g)
            return
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads])  # (tensors, K)
        if self.method == "global-l2norm":
            norms = norms.norm(dim=0).expand_as(norms)
        # min(1, threshold / norm) per tensor and member: at or under the threshold untouched.
        scales = (self.threshold / norms).clamp(max=1.0)
        for g, scale in zip(grads, scales):
            g.mul_(_along(scale, g))
