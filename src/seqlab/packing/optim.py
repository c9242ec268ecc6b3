"""Per-member training settings of a pack: each member's own learning rate (Adam, AdamW, SGDM,
RMSProp as conf/optimizer/ configures them, weight decay included: `packed_optimizer`), and MATLAB's
coupled L2 and gradient threshold and trainer.gradient_clip_val computed member by member
(seqlab.training.gradients and the fused loop's clipping do them for one network). Every tensor
here carries the member dimension first, so a setting is a (K,) tensor, viewed as (K, 1, ...)
against a parameter; nothing loops over members in Python. One fused Adam over the packed tensors
already equals K Adams when the members share one learning rate (Adam is elementwise);
`PackedAdam` is for members that do not, and runs the same kernel at a rate of 1."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from seqlab import SeqlabError
from seqlab.packing.flat import FlatState
from seqlab.schema import ThresholdMethod, choice
from seqlab.training.gradients import GradientTreatment
from seqlab.training.perf import optimizer_factory


def per_member(
    values: Sequence[Optional[float]], like: torch.Tensor, missing: float
) -> torch.Tensor:
    """A (K,) tensor of a setting, on `like`'s device; a member without one gets `missing`."""
    return torch.tensor(
        [missing if v is None else float(v) for v in values], dtype=like.dtype, device=like.device
    )


def _along(values: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """(K,) -> (K, 1, ..., 1): one value per member, broadcast over a packed tensor."""
    return values.view(-1, *([1] * (tensor.dim() - 1)))


class _PackedOptimizer(torch.optim.Optimizer):
    """An optimizer over packed parameters with a learning rate per member: member k steps with
    group["lr"] x group["member_lr"][k]. group["lr"] starts at 1 and is what a torch scheduler
    changes (a scalar, as schedulers expect), so a schedule (StepLR: MATLAB's piecewise drop)
    scales every member's own rate by the same factor, as each member's run alone would.
    `weight_decay` is torch's own: coupled (added to the gradient inside the step, biases too) for
    Adam, SGD and RMSprop; decoupled for AdamW. MATLAB's L2 is another thing, coupled into the
    gradient before the step, never on biases (PackedGradientTreatment)."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: Sequence[float],
        weight_decay: float = 0.0,
        **defaults: float,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} needs parameters")
        if any(p.shape[0] != len(lr) for p in params):
            raise ValueError(
                f"every packed parameter's first dimension must be the {len(lr)} members"
            )
        super().__init__(
            params,
            dict(
                lr=1.0,
                member_lr=per_member(lr, params[0], math.nan),
                weight_decay=float(weight_decay),
                **defaults,
            ),
        )

    @staticmethod
    def _rate(group: dict, p: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return _along(group["lr"] * group["member_lr"] * scale, p)

    @staticmethod
    def _grad(group: dict, p: torch.Tensor) -> torch.Tensor:
        """The gradient the update uses: with torch's coupled weight decay, grad + weight_decay * p
        (a new tensor, as torch makes it: p.grad stays the loss's)."""
        return p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad

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

    @torch.no_grad()
    def restart(self, k: int, lr: float) -> None:
        """Member k as a fresh optimizer's at rate `lr` (packing.refill.take_slot): its slice of every
        state tensor zeroed, where torch's optimizers start, so that its next step is a first step."""
        for group in self.param_groups:
            group["member_lr"][k] = lr
            for p in group["params"]:
                for value in self.state[p].values():
                    if isinstance(value, torch.Tensor) and value.shape == p.shape:
                        value[k].zero_()


class PackedAdam(_PackedOptimizer):
    """torch.optim.Adam's update (no amsgrad), member by member, over buffers (FlatState: its step
    replaces the base class's per-parameter one). `decoupled`: AdamW's weight decay."""

    decoupled = False

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: Sequence[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, weight_decay=weight_decay, betas=betas, eps=eps)
        for group in self.param_groups:  # each member's steps before its start (restart)
            group["member_start"] = torch.zeros_like(group["member_lr"])
        # Each group's buffers, by its place (a checkpoint's groups loaded replace the dicts).
        self._flats: dict[int, FlatState] = {}

    @torch.no_grad()
    def restart(self, k: int, lr: float) -> None:
        super().restart(k, lr)
        for group in self.param_groups:
            first = next((p for p in group["params"] if self.state[p]), None)
            group["member_start"][k] = self.state[first]["step"] if first is not None else 0

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch.optim's signature
        loss = None if closure is None else closure()
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            m, v = [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m.append(state["exp_avg"])
                v.append(state["exp_avg_sq"])
            step, flat = self.state[params[0]]["step"], self._flat(i, group, params, m, v)
            start = group.get("member_start")
            # A restarted member (restart): bias corrections of its own step count, a fresh Adam's.
            restarted = step - start if start is not None and flat.restarted(start) else None
            self._flat_step(group, flat, step, restarted)
        return loss

    def _flat(self, i: int, group: dict, params: list, m: list, v: list) -> FlatState:
        """The group's tensors in one buffer a kind (FlatState), bound again where one no longer
        lies in it (a checkpoint's optimizer state loaded, a gradient made anew)."""
        tensors = (params, [p.grad for p in params], m, v)
        flat = self._flats.get(i)
        if flat is None or not flat.holds(tensors, group["member_lr"]):
            flat = self._flats[i] = FlatState.bind(tensors, group["member_lr"])
        return flat

    def _flat_step(
        self, group: dict, flat: FlatState, step: int, restarted: Optional[torch.Tensor]
    ) -> None:
        """torch.optim.Adam's update at member k's rate over the buffers (a pack's steps are bound by
        launches: a foreach operation over a packed CNN-LSTM's dozen tensors is a dozen kernels).
        `restarted`: each member's own step count t, (K,), where a member restarted."""
        beta1, beta2 = group["betas"]
        lr, decay, grad = group["lr"], group["weight_decay"], flat.grad
        # AdamW: param.mul_(1 - lr * weight_decay) first; Adam: grad + weight_decay * p (coupled)
        if decay and self.decoupled:
            flat.param.mul_(1 - lr * flat.rate * decay)
        elif decay:
            grad = grad.add(flat.param, alpha=decay)
        if restarted is None:
            # One fused kernel: 0.4-0.7x the time of the operations below in a K = 32 step (EPYC)
            direction = flat.adam_direction(grad, step, beta1, beta2, group["eps"])
            flat.param.addcmul_(direction, flat.rate, value=lr)
            return
        flat.exp_avg.lerp_(grad, 1 - beta1)
        flat.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        second = flat.spread((1 - beta2**restarted).sqrt())
        rate, alpha = flat.spread(group["member_lr"] / (1 - beta1**restarted)), -lr
        denom = flat.exp_avg_sq.sqrt().div_(second).add_(group["eps"])
        flat.param.add_(flat.exp_avg.div(denom).mul_(rate), alpha=alpha)


class PackedAdamW(PackedAdam):
    """torch.optim.AdamW's update (no amsgrad), member by member."""

    decoupled = True

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: Sequence[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)


class PackedSGDM(_PackedOptimizer):
    """torch.optim.SGD's update with momentum (no dampening, no Nesterov), member by member."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: Sequence[float],
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, weight_decay=weight_decay, momentum=momentum)

    def _update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        grad = self._grad(group, p)
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = grad.clone()  # torch's first step: the gradient itself
        else:
            state["momentum_buffer"].mul_(group["momentum"]).add_(grad)
        p.sub_(self._rate(group, p) * state["momentum_buffer"])


class PackedRMSProp(_PackedOptimizer):
    """torch.optim.RMSprop's update (not centered, no momentum), member by member."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: Sequence[float],
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, weight_decay=weight_decay, alpha=alpha, eps=eps)

    def _update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        if not state:
            state["square_avg"] = torch.zeros_like(p)
        grad = self._grad(group, p)
        square_avg = (
            state["square_avg"].mul_(group["alpha"]).addcmul_(grad, grad, value=1 - group["alpha"])
        )
        p.sub_(self._rate(group, p) * grad / square_avg.sqrt().add_(group["eps"]))


# The config's optimizer class -> its packed form and the settings it carries over.
_PACKED = {
    torch.optim.Adam: (
        PackedAdam,
        ("betas", "eps", "weight_decay"),
        {"amsgrad": False, "maximize": False},
    ),
    torch.optim.AdamW: (
        PackedAdamW,
        ("betas", "eps", "weight_decay"),
        {"amsgrad": False, "maximize": False},
    ),
    torch.optim.SGD: (
        PackedSGDM,
        ("momentum", "weight_decay"),
        {"dampening": 0, "nesterov": False, "maximize": False},
    ),
    torch.optim.RMSprop: (
        PackedRMSProp,
        ("alpha", "eps", "weight_decay"),
        {"centered": False, "momentum": 0, "maximize": False},
    ),
}


def packed_optimizer(
    members: Sequence[torch.optim.Optimizer], params: Iterable[nn.Parameter]
) -> _PackedOptimizer:
    """The packed form of the members' optimizers over the packed tensors: each member's optimizer
    is built as its run alone builds it (conf/optimizer/ instantiated, over its own network), and its
    packed form takes the settings from torch's own (`defaults`; each member's rate from its
    param group). Adam, AdamW, SGD and RMSprop pack; a setting that cannot is one line naming it."""
    first = members[0]
    found = _PACKED.get(type(first))
    if found is None:
        raise SeqlabError(
            f"optimizer {type(first).__name__} cannot be packed: pack=off, or optimizer=adam|adamw|sgdm|rmsprop"
        )
    cls, carried, required = found
    given = first.defaults
    for key, value in required.items():
        if given.get(key, value) != value:
            raise SeqlabError(
                f"optimizer.{key}={given[key]} cannot be packed (only {value}): pack=off to train it"
            )
    differ = sorted({key for o in members[1:] for key in carried if o.defaults[key] != given[key]})
    if differ:  # the sweeper packs jobs that differ in packable keys only: optimizer.lr, not these
        raise SeqlabError(
            f"a pack's members differ in optimizer.{differ[0]}: only optimizer.lr can differ in a pack"
        )
    return cls(
        params, [o.param_groups[0]["lr"] for o in members], **{key: given[key] for key in carried}
    )


class PackedGradientTreatment:
    """MATLAB's coupled L2 (gradient += l2 * w on weights and BatchNorm scale/offset, never biases)
    and gradient threshold, each member with its own factor and threshold (None: none), with the
    threshold method all members share (it is a shape of the computation, not a setting). Then
    trainer.gradient_clip_val (`clip`), as the fused loop clips a run alone's gradients after them:
    torch's clip_grad_norm_ over each member's parameters, by that member's own total norm."""

    def __init__(
        self,
        l2_params: Sequence[nn.Parameter],
        learnables: Sequence[Sequence[nn.Parameter]],
        l2: Sequence[float],
        threshold: Sequence[Optional[float]],
        method: str = "l2norm",
        clip: Optional[float] = None,
    ) -> None:
        self.method = choice(ThresholdMethod, method, "module.gradient_threshold_method")
        # `learnables`: each learnable parameter of a member's network as its packed tensors
        # (PackedCNNLSTM.learnables: conv.weight is two); the per-parameter norm is over all of them.
        self.learnables = [list(group) for group in learnables]
        self.params, self.l2_params = [p for g in self.learnables for p in g], list(l2_params)
        self.l2 = per_member(l2, self.params[0], 0.0)
        self.threshold = per_member(threshold, self.params[0], math.inf)
        self.clip = float(clip) if clip else None
        self.active_l2 = bool(self.l2.any())
        self.active_threshold = bool(torch.isfinite(self.threshold).any())

    def set_member(self, k: int, l2: float, threshold: Optional[float]) -> None:
        """Member k's own factor and threshold (a search's trial that takes a pruned member's slot)."""
        self.l2[k] = float(l2 or 0.0)
        self.threshold[k] = math.inf if threshold is None else float(threshold)
        self.active_l2 = bool(self.l2.any())
        self.active_threshold = bool(torch.isfinite(self.threshold).any())

    @property
    def active(self) -> bool:
        return self.active_l2 or self.active_threshold or self.clip is not None

    @torch.no_grad()
    def __call__(self) -> None:
        if self.active_l2:
            for p in self.l2_params:
                if p.grad is not None:
                    p.grad.add_(_along(self.l2, p) * p)
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.active_threshold:
            self._threshold()
        if self.clip is not None:
            # clip_grad_norm_: coefficient max_norm / (total norm + 1e-6), at most 1; here a (K,) of them.
            total = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
            scale = (self.clip / (total + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(_along(scale, g))

    def _threshold(self) -> None:
        groups = [[p.grad for p in g if p.grad is not None] for g in self.learnables]
        groups = [g for g in groups if g]
        if self.method == "absolute-value":
            for g in (g for group in groups for g in group):
                bound = _along(self.threshold, g)
                torch.clamp(g, -bound, bound, out=g)
            return
        norms = torch.stack([_norm(group) for group in groups])  # (parameters, K)
        if self.method == "global-l2norm":
            norms = norms.norm(dim=0).expand_as(norms)
        # min(1, threshold / norm) per parameter and member: at or under the threshold untouched.
        scales = (self.threshold / norms).clamp(max=1.0)
        for group, scale in zip(groups, scales):
            for g in group:
                g.mul_(_along(scale, g))


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """(K,): each member's L2 norm of one parameter's gradient, held in one or more packed tensors."""
    norms = [g.flatten(1).norm(dim=1) for g in grads]
    return norms[0] if len(norms) == 1 else torch.stack(norms).norm(dim=0)


@dataclass
class Update:
    """How a job's network of K >= 1 members is updated: its optimizer and schedule, its gradient
    treatment (None: none), and each member's learning rate as a multiple of the optimizer's group
    rate (what each member's run logs as `lr`)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    gradients: Any
    lr_scale: list[float]


def build_update(
    model: nn.Module,
    networks: Sequence[nn.Module],
    optimizers: Sequence[Callable[..., torch.optim.Optimizer]],
    scheduler: Optional[Callable[..., Any]],
    l2: Sequence[float],
    threshold: Sequence[Optional[float]],
    method: str,
    *,
    clip: Optional[float] = None,
    impl: str = "fused",
    capturable: bool = False,
    one_step: bool = False,
    restartable: bool = False,
    may_decay: bool = False,
) -> Update:
    """The update of `model` (packing.model.pack_of: one network, or K packed). Each member's
    optimizer (`optimizers`, conf/optimizer/ instantiated) is built as its run alone builds it, over
    its own network (`networks`), for its settings; the members differ only in their rate (a packable
    key), the rest is the job's. One rate: the configured optimizer itself over the model's tensors,
    fused as a single run's (Adam, AdamW, SGD and RMSprop are elementwise, so over packed tensors it
    is each member's own); rates that differ: its packed form (`packed_optimizer`). `one_step`: the
    data has one step per sample, where a packed network leaves out what then never trains
    (PackedCNNLSTM.freeze_unused) unless something decays it. `l2`, `threshold`: each member's
    MATLAB L2 factor and gradient threshold; `clip`: trainer.gradient_clip_val where the fused loop
    steps the optimizer itself (Lightning clips in automatic optimisation). `restartable`: members
    may be replaced (hydra.sweeper.refill): the packed optimizer (restart), the gradient treatment
    kept though none has one yet; `may_decay`: a new member may have its L2, nothing left out."""
    own = [make(params=net.parameters()) for make, net in zip(optimizers, networks)]
    decays = any(o.defaults.get("weight_decay", 0.0) for o in own) or any(l2) or may_decay
    if one_step and not decays and hasattr(model, "freeze_unused"):
        model.freeze_unused()
    params = [p for p in model.parameters() if p.requires_grad]
    lrs = [o.param_groups[0]["lr"] for o in own]
    restarts = restartable and len(own) > 1  # a pack's slots may be refilled
    if len(set(lrs)) == 1 and not restarts:
        optimizer = optimizer_factory(optimizers[0], impl, capturable=capturable)(params=params)
        lr_scale = [1.0] * len(own)
    else:
        optimizer = packed_optimizer(own, params)
        lr_scale = [float(lr) for lr in lrs]
    if len(own) == 1:  # a run alone (OneMember): its network's own parameters
        gradients = GradientTreatment(model.net, l2[0], threshold[0], method, clip=clip)
    else:
        gradients = PackedGradientTreatment(
            model.l2_parameters(), model.learnables(), l2, threshold, method, clip=clip
        )
    return Update(
        optimizer,
        scheduler(optimizer=optimizer) if scheduler is not None else None,
        gradients if gradients.active or restarts else None,
        lr_scale,
    )
