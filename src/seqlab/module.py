"""The LightningModule: half-MSE loss, torchmetrics on train and validation, optimizer and
scheduler built from their config groups. Nothing here reads a value back to the host during a
training step: metrics accumulate on the device and are computed once per epoch."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score


def half_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MATLAB's regressionLayer loss: 0.5 * mean over the batch of the sum over responses of
    the squared error (not divided by the number of responses)."""
    return 0.5 * (pred - target).pow(2).sum(dim=1).mean()


def _metrics(prefix: str, postfix: str = "") -> MetricCollection:
    return MetricCollection(
        {"rmse": MeanSquaredError(squared=False), "mae": MeanAbsoluteError(), "r2": R2Score()},
        prefix=prefix,
        postfix=postfix,
    )


class SeqRegressor(pl.LightningModule):
    def __init__(
        self,
        model: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Optional[Callable[..., Any]] = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        # Per-step train_loss/train_rmse are recorded by tracking.StepMetricsRecorder from the
        # step's loss; these are the epoch-level train metrics over every sample of the epoch.
        self.train_metrics = _metrics("train_", "_epoch")
        self.val_metrics = _metrics("val_")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        pred = self.model(x)
        loss = half_mse(pred, y)
        self.train_metrics.update(pred.detach(), y)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log_dict(self.train_metrics.compute())
        self.train_metrics.reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        pred = self.model(x)
        self.val_metrics.update(pred, y)
        self.log("val_loss", half_mse(pred, y), on_epoch=True, batch_size=len(x))

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute())
        self.val_metrics.reset()

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
