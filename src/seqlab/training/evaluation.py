"""The losses, and what a network is measured with once its training ends: its final validation
metrics as saved (MATLAB's FinalValidation*, torchmetrics over its validation set), BatchNorm's
population statistics, and the run's medians. A run alone's and a pack member's alike (the
LightningModule of every job is seqlab.packing.module.SeqRegressor)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

log = logging.getLogger("seqlab")


def half_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MATLAB's regressionLayer loss: 0.5 * mean over the batch of the sum over responses of
    the squared error (not divided by the number of responses)."""
    return 0.5 * (pred - target).pow(2).sum(dim=1).mean()


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(pred, target)


# Each loss and how to get the batch's mean squared error back from its value (R responses):
# the per-step train_rmse is derived from the loss, so it costs nothing extra per step.
LOSS_FUNCTIONS = {"half_mse": half_mse, "mse": mse}
LOSS_TO_MSE = {"half_mse": lambda loss, r: 2.0 * loss / r, "mse": lambda loss, r: loss}

# The same losses member by member, for a network of K members (packing.model): (K, batch,
# responses) -> (K,). Their sum is what the training loop's backward takes: member k's parameters
# get member k's gradient alone.
MEMBER_LOSSES = {
    "half_mse": lambda pred, target: 0.5 * (pred - target).pow(2).sum(dim=2).mean(dim=1),
    "mse": lambda pred, target: (pred - target).pow(2).mean(dim=(1, 2)),
}


def _metrics(prefix: str, postfix: str = "") -> MetricCollection:
    return MetricCollection(
        {"rmse": MeanSquaredError(squared=False), "mae": MeanAbsoluteError(), "r2": R2Score()},
        prefix=prefix,
        postfix=postfix,
    )


def _compute(metrics: MetricCollection) -> dict[str, torch.Tensor]:
    """Every metric that can be computed: R2 needs at least two samples, and a one-sample
    validation set should not stop a run."""
    out = {}
    for name, metric in metrics.items(keep_base=False):
        try:
            out[name] = metric.compute()
        except ValueError:
            pass
    return out


def _unpack(
    batch: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    x, y, *rest = batch
    return x, y, (rest[0] if rest else None)


@torch.no_grad()
def population_bn_statistics_(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device
) -> int:
    """MATLAB's BatchNormalizationStatistics='population': after training, one pass over the
    training data; each BatchNorm layer's mean and variance become those of its inputs over every
    sample and step. Returns the number of BatchNorm layers updated."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return 0
    sums = {m: [0, None, None] for m in layers}  # count, sum, sum of squares (float64)

    def collect(module: nn.Module, inputs: tuple[torch.Tensor]) -> None:
        x = inputs[0].double()
        dims = [d for d in range(x.dim()) if d != 1]  # every dim but channels
        acc = sums[module]
        acc[0] += x.numel() // x.shape[1]
        s, q = x.sum(dims), x.pow(2).sum(dims)
        acc[1] = s if acc[1] is None else acc[1] + s
        acc[2] = q if acc[2] is None else acc[2] + q

    hooks = [m.register_forward_pre_hook(collect) for m in layers]
    was_training = model.training
    model.eval()  # stored statistics stay untouched during the pass; dropout off
    try:
        for batch in batches:
            x, _, lengths = _unpack(batch)
            model(x.to(device), None if lengths is None else lengths.to(device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    for m, (count, s, q) in sums.items():
        mean = s / count
        var = (q / count - mean.pow(2)).clamp(min=0)
        if count > 1:
            var = var * count / (count - 1)  # unbiased, as PyTorch's running_var
        m.running_mean.copy_(mean.to(m.running_mean.dtype))
        m.running_var.copy_(var.to(m.running_var.dtype))
    return len(layers)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, ...]],
    device: torch.device,
) -> dict[str, float]:
    """Loss, RMSE, MAE and R2 of a network in evaluation mode over some batches."""
    was_training = model.training
    model.eval()
    metrics = _metrics("").to(device)
    total, count = 0.0, 0
    try:
        for batch in batches:
            x, y, lengths = _unpack(batch)
            x, y = x.to(device), y.to(device)
            pred = model(x, None if lengths is None else lengths.to(device))
            metrics.update(pred, y)
            total += float(loss_fn(pred, y)) * len(x)
            count += len(x)
    finally:
        model.train(was_training)
    out = {k: float(v) for k, v in _compute(metrics).items()} if count else {}
    if count:
        out["loss"] = total / count
    return out


def final_metrics(
    network: nn.Module,
    loss: str,
    bn_statistics: str,
    datamodule: Any,
    device: torch.device,
    wall: float,
    baseline: Optional[float],
) -> dict[str, float]:
    """MATLAB's FinalValidation*: the network as saved (after any BatchNorm finalisation:
    module.bn_statistics); a run alone's and a pack member's alike."""
    if bn_statistics == "population":
        population_bn_statistics_(network, datamodule.train_eval_batches(), device)
        log.info(
            "batchnorm population statistics from one pass over the %d training samples",
            len(datamodule.train),
        )
    summary = {"train_wall_s": wall}
    val_batches = datamodule.val_dataloader()
    if val_batches:
        summary.update(
            {
                f"final_val_{k}": v
                for k, v in evaluate(network, LOSS_FUNCTIONS[loss], val_batches, device).items()
            }
        )
    if baseline is not None:
        summary["val_rmse_baseline"] = baseline
    return summary


def metrics_per_member(pred: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """RMSE, MAE and R2 (averaged over responses, as torchmetrics' R2Score) of each member's
    predictions: (K, samples, responses) -> K values each. R2 needs two samples or more."""
    err = (pred - target).double()
    out = {
        "rmse": err.pow(2).mean(dim=(1, 2)).sqrt().tolist(),
        "mae": err.abs().mean(dim=(1, 2)).tolist(),
    }
    if target.shape[1] > 1:
        target = target.double()
        sst = (target - target.mean(dim=1, keepdim=True)).pow(2).sum(dim=1)
        out["r2"] = (1 - err.pow(2).sum(dim=1) / sst).mean(dim=1).tolist()
    return out
