"""Per-step metrics (train_loss, train_rmse, lr) without a per-step host synchronisation: the
training loop adds each step's (K,) losses to a `StepLog`; `StepMetricsRecorder` reads them back
together and sends each member's in one batch to its run, a few times a second at most."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import pytorch_lightning as pl
import torch


class StepLog:
    """Every optimizer step's loss, number, learning rate and time, until the recorder sends them.
    The loss stays a reference to a device tensor (no copy, no synchronisation); so does a tensor
    learning rate (CUDA graphs), which the training loop copies once per call, before a
    scheduler can change it in place."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.steps: list[int] = []
        self.lrs: list[Any] = []
        self.times: list[int] = []

    def add(self, loss: torch.Tensor, step: int, lr: Any) -> None:
        self.losses.append(loss)
        self.steps.append(step)
        self.lrs.append(lr)
        self.times.append(int(time.time() * 1000))

    def __len__(self) -> int:
        return len(self.steps)

    def take(self) -> tuple[list[torch.Tensor], list[int], list[Any], list[int]]:
        taken = self.losses, self.steps, self.lrs, self.times
        self.losses, self.steps, self.lrs, self.times = [], [], [], []
        return taken


class StepMetricsRecorder(pl.Callback):
    """Between Lightning calls, once at least `every_n_steps` steps wait in `steps` and `every_s`
    seconds have passed since the last send, their losses are read back together and each member's
    sent to its run in one batch (each send costs the loop a read-back and a wake-up of the writer:
    a few a second is live enough for a chart), and before each validation; the rest at the end of
    training, at an exception, and before each checkpoint (a resume continues after it and never sends again what a run
    holds). A member gets the steps it trained: none after it failed, none past where it stopped
    (packing.members.Member). The per-step train_rmse is a function of the loss (`loss_to_mse`), so
    it costs the step nothing; `lr` is the optimizer's, times the member's own scale. Under DDP
    every process must send at the same steps (the losses are averaged across them): pass
    every_s=0 there."""

    def __init__(
        self,
        members: list,
        every_n_steps: int,
        loss_to_mse: Callable[[float], float],
        every_s: float,
    ) -> None:
        self.members = members
        self.every_n_steps = every_n_steps
        self.every_s = every_s
        self.loss_to_mse = loss_to_mse
        self.steps = StepLog()
        self.last_sent = time.monotonic()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if (
            len(self.steps) >= self.every_n_steps
            and time.monotonic() - self.last_sent >= self.every_s
        ):
            self.flush()

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Before a validation is judged (best, patience, pruning), a loss that became NaN is known
        # (tracking.DivergenceCheck, after this): its member fails, it does not "stop early". Here,
        # after the epoch timer has paused for the validation, it costs the training no time.
        if not trainer.sanity_checking:
            self.flush()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flush()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.flush()  # the steps trained before an interruption are part of the run

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        self.flush()

    def flush(self) -> None:
        self.last_sent = time.monotonic()
        if not self.steps:
            return
        losses, steps, lrs, times = self.steps.take()
        losses = torch.stack(losses)  # (steps, K)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # DDP: each process trained on its own share of the batch; the step's loss is their
            # mean. Every process flushes at the same steps, so this collective lines up.
            torch.distributed.all_reduce(losses)
            losses = losses / torch.distributed.get_world_size()
        table = losses.t().tolist()  # (K, steps): the one synchronisation
        if isinstance(lrs[0], torch.Tensor):
            lrs = torch.stack(lrs).tolist()  # read back together with the losses
        else:
            lrs = [float(lr) for lr in lrs]
        for m, values in zip(self.members, table):
            if m.status == "FAILED" or (m.final_step is not None and m.final_step < steps[0]):
                continue  # it ended before these steps
            # Its steps: after its start (a refilled slot's member starts at a later step of the
            # pack), up to where it stopped; numbered as its run counts them.
            lo = sum(s <= m.start_step for s in steps) if m.start_step else 0
            n = len(steps) if m.final_step is None else sum(s <= m.final_step for s in steps)
            if n <= lo:
                continue
            rmse = [
                math.sqrt(max(self.loss_to_mse(v), 0.0)) if math.isfinite(v) else v
                for v in values[lo:n]
            ]
            with m.own_failure("its step metrics", steps[0]):
                m.tracker.log_series(
                    {
                        "train_loss": values[lo:n],
                        "train_rmse": rmse,
                        "lr": [lr * m.lr_scale for lr in lrs[lo:n]],
                    },
                    [m.own_step(s) for s in steps[lo:n]] if m.start_step else steps[:n],
                    times[lo:n],
                )
