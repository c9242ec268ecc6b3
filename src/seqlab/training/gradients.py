"""MATLAB's gradient treatment, applied between backward and the optimizer step:
coupled L2 regularisation (gradient += l2 * w, weights and BatchNorm scale/offset only, never
biases), then the gradient threshold. Everything is done with foreach kernels on the device: no
Python loop over parameters with a host read-back, so it costs a few launches a step."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from seqlab.schema import ThresholdMethod, choice


def l2_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters MATLAB regularises (L2Factor 1): weights of conv, LSTM and fully connected
    layers, and BatchNorm's scale and offset. Biases have L2Factor 0."""
    chosen = []
    for module in model.modules():
        is_bn = isinstance(module, nn.modules.batchnorm._BatchNorm)
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and (is_bn or not name.startswith("bias")):
                chosen.append(param)
    return chosen


class GradientTreatment:
    """One network's (a run alone's, seqlab.packing.model.OneMember): MATLAB's L2 and threshold,
    then trainer.gradient_clip_val (`clip`) where the fused loop steps the optimizer itself
    (Lightning clips only in automatic optimisation). A pack's members have theirs in
    seqlab.packing.optim.PackedGradientTreatment."""

    def __init__(
        self,
        model: nn.Module,
        l2_regularization: float = 0.0,
        threshold: Optional[float] = None,
        method: str = "l2norm",
        clip: Optional[float] = None,
    ) -> None:
        method = choice(ThresholdMethod, method, "module.gradient_threshold_method")
        self.l2 = l2_regularization
        self.threshold = threshold
        self.method = method
        self.clip = float(clip) if clip else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.l2_params = l2_parameters(model)

    @property
    def active(self) -> bool:
        return bool(self.l2) or self.threshold is not None or self.clip is not None

    @torch.no_grad()
    def __call__(self) -> None:
        if self.l2:
            pairs = [(p.grad, p) for p in self.l2_params if p.grad is not None]
            if pairs:
                grads, weights = zip(*pairs)
                torch._foreach_add_(list(grads), list(weights), alpha=self.l2)
        if self.threshold is not None:
            clip_(self.params, self.threshold, self.method)
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)


@torch.no_grad()
def clip_(params: Iterable[nn.Parameter], threshold: float, method: str = "l2norm") -> None:
    """'l2norm': each tensor's gradient rescaled on its own when its L2 norm exceeds the threshold;
    'global-l2norm': all gradients rescaled together when their joint norm exceeds it;
    'absolute-value': every element clamped to [-threshold, threshold]."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if method == "absolute-value":
        torch._foreach_clamp_min_(grads, -threshold)
        torch._foreach_clamp_max_(grads, threshold)
        return
    norms = torch.stack(torch._foreach_norm(grads))
    if method == "global-l2norm":
        norms = norms.norm().expand(len(grads))
    # min(1, threshold / norm): tensors at or under the threshold are untouched (x / 0 -> inf -> 1).
    scale = (threshold / norms).clamp(max=1.0)
    torch._foreach_mul_(grads, list(scale.unbind()))
