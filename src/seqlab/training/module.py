"""The LightningModule: the loss, torchmetrics on train and validation, optimizer and scheduler
built from their config groups, and MATLAB's gradient treatment (coupled L2, gradient threshold)
where the module config asks for it. The default training loop itself lives in seqlab.training.loop.
Nothing here reads a value back to the host during a training step: metrics accumulate on the
device and are computed once per epoch."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

import pytorch_lightning as pl
import torch
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

from seqlab.schema import ModuleConfig as _Defaults
from seqlab.training.gradients import GradientTreatment
from seqlab.training.lightning_private import count_optimizer_steps
from seqlab.training.loop import FusedLoop, lightning_steps
from seqlab.training.profiling import phase

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


class SeqRegressor(pl.LightningModule):
    """Built from conf/module/ (a partial) with the model, optimizer and scheduler, and how it
    trains: with `loop` (a partial of seqlab.training.loop.FusedLoop, perf=fast) each training_step runs
    the K mini-batches of its item in that loop; without (perf=naive, and DDP), Lightning's
    automatic optimisation runs one step a call."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Optional[Callable[..., Any]] = None,
        loss: str = _Defaults.loss,
        l2_regularization: float = _Defaults.l2_regularization,
        gradient_threshold: Optional[float] = _Defaults.gradient_threshold,
        gradient_threshold_method: str = _Defaults.gradient_threshold_method,
        bn_statistics: str = _Defaults.bn_statistics,
        output_network: str = _Defaults.output_network,
        validation_patience: Optional[int] = _Defaults.validation_patience,
        step_log: Optional[Any] = None,
        loop: Optional[Callable[..., FusedLoop]] = None,
        loss_on_progress_bar: bool = False,
    ) -> None:
        super().__init__()
        self.automatic_optimization = loop is None
        self.loop_factory = loop
        self.loop: Optional[FusedLoop] = None  # built when training starts: it needs the optimizer
        # Every step's loss, number and learning rate, kept until tracking sends them (seqlab.tracking).
        self.step_log = step_log
        self.loss_on_progress_bar = loss_on_progress_bar
        self.samples_trained = 0  # samples the optimizer steps have used (for throughput)
        self.model = model
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.loss_name = loss
        self.loss_fn = LOSS_FUNCTIONS[loss]
        self.gradients = GradientTreatment(
            model, l2_regularization, gradient_threshold, gradient_threshold_method
        )
        self.bn_statistics = bn_statistics
        # Which network training ends with and when it stops early: kept here with the other
        # trainingOptions; acted on by seqlab.callbacks.output_network's callback.
        self.output_network, self.validation_patience = output_network, validation_patience
        # Per-step train_loss/train_rmse come from the step log; these are the epoch-level train
        # metrics over every sample of the epoch.
        self.train_metrics = _metrics("train_", "_epoch")
        self.val_metrics = _metrics("val_")

    def forward(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.model(x, lengths)

    def on_train_start(self) -> None:
        if self.loop_factory is None:
            return
        optimizer = self.optimizers()
        self.loop = self.loop_factory(
            model=self.model,
            optimizer=optimizer.optimizer,
            loss_fn=self.loss_fn,
            step_log=self.step_log,
            gradients=self.gradients,
            **lightning_steps(self),
        )

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y, lengths = _unpack(batch)
        if self.loop is not None:
            return self._loop_step(x, y, lengths, batch_idx)
        self.samples_trained += len(x)
        with phase("forward"):
            pred = self.model(x, lengths)
            loss = self.loss_fn(pred, y)
        self.train_metrics.update(pred.detach(), y)
        if self.loss_on_progress_bar:  # perf=naive: what a first Lightning module does
            self.log("loss", loss, prog_bar=True, logger=False, on_step=True, on_epoch=False)
        if self.step_log is not None:
            # Called before Lightning's optimizer step: this step is global_step + 1.
            with phase("logging"):
                self.step_log.add(
                    loss.detach(),
                    self.global_step + 1,
                    self.trainer.optimizers[0].param_groups[0]["lr"],
                )
        return loss

    def _loop_step(
        self, x: torch.Tensor, y: torch.Tensor, lengths: Optional[torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        max_steps = self.trainer.max_steps
        n, loss = self.loop.run(
            x,
            y,
            lengths,
            self.global_step + 1,
            max_steps - self.global_step if max_steps > 0 else None,
        )
        if not self.loop.counts_steps:
            count_optimizer_steps(self.optimizers(), n)
        self.samples_trained += min(
            len(x), n * self.loop.batch_size
        )  # only an item's last batch can be short
        if batch_idx + 1 >= self.trainer.num_training_batches:
            # Folded in at the epoch's last item, so this work counts in the epoch's timing as a
            # per-step metric update does on the automatic path.
            self._fold_epoch_predictions()
        return loss

    def _fold_epoch_predictions(self) -> None:
        taken = self.loop.take_epoch() if self.loop is not None else None
        if taken is not None:
            self.train_metrics.update(*taken)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Dropout draws from the global generators: a resumed run continues their streams.
        checkpoint["rng_states"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["rng_states"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("rng_states") or {}
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])

    def on_validation_model_zero_grad(self) -> None:
        # Lightning frees gradients before validation; the fused loop keeps them (zeroed in
        # place each step), so that a captured CUDA graph's gradient tensors stay the live ones.
        if self.automatic_optimization:
            super().on_validation_model_zero_grad()

    # Lightning's automatic optimisation runs these two hooks: marked for the profiler.
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with phase("backward"):
            super().backward(loss, *args, **kwargs)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        with phase("optimizer"):
            super().optimizer_step(*args, **kwargs)

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        with phase("host_to_device"):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_train_epoch_end(self) -> None:
        if not self.automatic_optimization:
            self._fold_epoch_predictions()  # an epoch that max_steps or a stop ended early
        self.log_dict(_compute(self.train_metrics))
        self.train_metrics.reset()
        if not self.automatic_optimization:
            scheduler = self.lr_schedulers()  # Lightning steps it only in automatic optimisation
            if scheduler is not None:
                scheduler.step()

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        x, y, lengths = _unpack(batch)
        pred = self.model(x, lengths)
        self.val_metrics.update(pred, y)
        self.log("val_loss", self.loss_fn(pred, y), on_epoch=True, batch_size=len(x))

    def on_validation_epoch_end(self) -> None:
        self.log_dict(_compute(self.val_metrics))
        self.val_metrics.reset()

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Optional[float] = None,
        gradient_clip_algorithm: Optional[str] = None,
    ) -> None:
        # Lightning calls this after backward and before the optimizer step, which is where
        # MATLAB adds the L2 term and applies the threshold (in that order).
        if self.gradients.active:
            self.gradients()
        if gradient_clip_val:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"},
        }


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
    median: Callable[[str], Optional[float]],
    baseline: Optional[float],
) -> dict[str, float]:
    """MATLAB's FinalValidation*: the network as saved (after any BatchNorm finalisation:
    module.bn_statistics), and the run's medians over epochs (`median`: the epoch timer's); a run
    alone's and a pack member's alike."""
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
    for key in ("it_per_s", "samples_per_s"):
        value = median(key)
        if value is not None:
            summary[f"{key}_median"] = value
    if baseline is not None:
        summary["val_rmse_baseline"] = baseline
    return summary
