"""The packed training loop, in one place (issue 22): K members of the network, one step for all.

    for each epoch:                     every member draws its own sample order (its data's generator)
        for each mini-batch:
            zero the gradients -> forward (K, batch) -> each member's loss -> backward of their sum
            -> MATLAB's L2 and threshold per member -> one optimizer step over the packed tensors
        each member's epoch: timing, train metrics, validation, best, patience
        the scheduler's step (the same factor for every member's own rate)

It is seqlab.training.loop.FusedLoop's step with a member dimension, without Lightning: the
pack's members are K MLflow runs, each with its own callbacks' bookkeeping (seqlab.packing.members),
which a Trainer built for one run cannot hold. As in FusedLoop nothing is read back to the host
per step: each step leaves its (K,) losses, read back together a few times a second and sent to
each member's run; a member whose loss became NaN or Inf ends FAILED there, the others go on."""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from seqlab.packing.members import Member
from seqlab.packing.model import MEMBER_LOSSES, PackedCNNLSTM
from seqlab.resume.requeue import Preempted, preempt_signal
from seqlab.resume.safe_writes import replace_atomically

log = logging.getLogger("seqlab")

DIVERGED = ("the training loss became {value} at step {step}: training diverged; lower optimizer.lr, "
            "set module.gradient_threshold, or check the data")


def samples_key(data: DictConfig) -> str:
    """What makes a member's samples: its data config, but for data.seed where the samples come from a
    file (data.path: the seed only splits and orders them; generated data depends on it). Members with
    one key read the samples once and share them (PackData.of)."""
    settings = OmegaConf.to_container(data, resolve=True)
    if settings.get("path"):
        settings.pop("seed", None)
    return json.dumps(settings, sort_keys=True, default=str)


# Rows gathered at once for a validation: the K members' samples of one chunk (member-major).
VAL_ROWS = 8192


@dataclass
class PackData:
    """The members' one-step data on the training device, each distinct set of samples once, as rows
    (samples, features): members whose samples are the same (one file, split and shuffled by each
    member's own seed; or one data config) share them, and each member has its own training and
    validation rows into them, in its split's order (data.module.SeqDataModule.split)."""
    x: torch.Tensor  # (rows, features)
    y: torch.Tensor  # (rows, responses)
    train_rows: torch.Tensor  # (K, training samples) long
    val_rows: Optional[torch.Tensor]  # (K, validation samples) long; None: no validation
    batch_size: int
    n_batches: int  # per epoch (data.module.TensorBatches.n_batches)
    shuffle: bool
    # Each member's validation inputs gathered once, (K, samples, features), where no member shares its
    # samples (the memory is then the sets' own, as before the sharing, and no validation gathers them
    # again); None: gathered a chunk at a time from the shared rows (val_chunks).
    val_x: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, members: list[Member], device: torch.device) -> "PackData":
        """The members' data on the device: each distinct set of samples once (its rows, then a
        validation set that came with it), and each member's training and validation rows into them,
        its split's (SeqDataModule.split) or the data's own validation set."""
        blocks, offsets, train_rows, val_rows = [], {}, [], []
        for m in members:
            dm, data = m.datamodule, m.datamodule.samples
            if id(data) not in offsets:
                offsets[id(data)] = sum(len(b) for b in blocks)
                blocks += [data] + ([data.val] if data.val is not None else [])
            base = offsets[id(data)]
            if data.val is not None:
                train, val = np.arange(len(data)), len(data) + np.arange(len(data.val))
            else:
                train, val = dm.split(len(data))
            train_rows.append(base + train)
            val_rows.append(base + val)

        def rows(what: str, one_step: bool) -> torch.Tensor:
            # One block on the CPU is the samples' own memory (from_numpy, .to: no copy).
            arrays = [getattr(b, what)[:, 0] if one_step else getattr(b, what) for b in blocks]
            joined = torch.from_numpy(arrays[0]) if len(arrays) == 1 else torch.cat([torch.from_numpy(a) for a in arrays])
            return joined.to(device)

        dm = members[0].datamodule
        n, bs = len(train_rows[0]), dm.batch_size
        drop = dm.drop_last or dm.drop_single
        data = cls(x=rows("x", True), y=rows("y", False), train_rows=torch.from_numpy(np.stack(train_rows)).to(device),
                   val_rows=torch.from_numpy(np.stack(val_rows)).to(device) if len(val_rows[0]) else None,
                   batch_size=bs, n_batches=n // bs if drop else -(-n // bs), shuffle=dm.shuffle)
        if data.val_rows is not None and len(offsets) == len(members):
            k, n_val = data.val_rows.shape
            data.val_x = data.x.index_select(0, data.val_rows.reshape(-1)).view(k, n_val, -1)
        return data

    @property
    def n_samples(self) -> int:
        return self.train_rows.shape[1]

    def orders(self, members: list[Member]) -> torch.Tensor:
        """(K, samples): each member's order for this epoch, drawn as its run alone draws it (a
        permutation of its training set), as rows of x."""
        if not self.shuffle:
            return self.train_rows
        n, device = self.n_samples, self.x.device
        order = torch.stack([torch.randperm(n, generator=m.order, device=device) for m in members])
        return self.train_rows.gather(1, order)

    def val_targets(self) -> torch.Tensor:
        """(K, samples, responses): each member's validation targets."""
        k, n = self.val_rows.shape
        return self.y.index_select(0, self.val_rows.reshape(-1)).view(k, n, -1)

    def val_chunks(self):
        """Each member's validation inputs, (K, chunk, features), a chunk of samples at a time: gathered
        from the shared rows (K whole copies would cost K validation sets of memory)."""
        k, n = self.val_rows.shape
        chunk = max(1, VAL_ROWS // k)
        for i in range(0, n, chunk):
            if self.val_x is not None:
                yield self.val_x[:, i:i + chunk]
                continue
            idx = self.val_rows[:, i:i + chunk]
            yield self.x.index_select(0, idx.reshape(-1)).view(k, idx.shape[1], -1)

    def batch(self, orders: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mini-batch b of every member: (K, batch, features), (K, batch, responses), gathered in
        one index_select each (advanced indexing of a (K, batch) index cost a third of the step)."""
        idx = orders[:, b * self.batch_size : (b + 1) * self.batch_size]
        k, n = idx.shape
        flat = idx.reshape(-1)
        return self.x.index_select(0, flat).view(k, n, -1), self.y.index_select(0, flat).view(k, n, -1)


class StopRequest:
    """Ctrl-C or SIGTERM: the pack stops at the next step boundary with a checkpoint (a second
    Ctrl-C stops at once, without one), as a single run does (resume.interrupt.GracefulStop). In a
    submitit job (SLURM), so does submitit's time-limit/preemption signal (SIGUSR2): once the
    members' runs have ended KILLED, `preempted()` hands the job back to submitit, which requeues it,
    and the job started again continues the same runs (seqlab.packing.task: _previous_attempt)."""

    def __init__(self) -> None:
        self.signal: Optional[str] = None
        self._previous: dict[int, Any] = {}
        self._preempt = preempt_signal()

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM, self._preempt):
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signal = signal.Signals(signum).name
        if signum == self._preempt:
            log.warning("%s: the job is preempted or near its time limit; stopping the pack after this step to save "
                        "a checkpoint, then the job is requeued and continues its members' runs", self.signal)
        else:
            log.warning("stopping the pack after this step to save a checkpoint (Ctrl-C again stops at once, without one)")

    def preempted(self) -> Optional[Preempted]:
        """After a stop on submitit's signal: what requeues the job once its runs have ended."""
        handler = self._previous.get(self._preempt) if self._preempt is not None else None
        if self.signal != (signal.Signals(self._preempt).name if self._preempt else None) or not callable(handler):
            return None
        return Preempted(self._preempt, handler)

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class PackStopped(Exception):
    """The pack stopped at a signal, after saving its checkpoint."""

    def __init__(self, signal_name: str, path: Path, step: int) -> None:
        super().__init__(f"stopped by {signal_name} at step {step}")
        self.signal, self.path, self.step = signal_name, path, step


class PackTrainer:
    """Trains the members of `model` together. Built by seqlab.packing.task with everything it
    needs; `fit()` runs to max_epochs, max_steps or max_time, or until no member is left training."""

    def __init__(self, model: PackedCNNLSTM, optimizer: torch.optim.Optimizer, scheduler: Any,
                 gradients: Any, loss: str, loss_to_mse: Callable[[float], float], data: PackData,
                 members: list[Member], *, lr_scale: torch.Tensor, max_epochs: int, max_steps: int,
                 max_time_s: Optional[float], flush_every_n_steps: int, flush_every_s: float,
                 checkpoint_path: Path, checkpoint_every_s: float, publish: Callable[[Path, int], None],
                 stop: StopRequest, exact_dropout: bool, progress: Optional[TextIO] = None) -> None:
        self.model, self.optimizer, self.scheduler, self.gradients = model, optimizer, scheduler, gradients
        self.loss_fn, self.loss_to_mse = MEMBER_LOSSES[loss], loss_to_mse
        self.data, self.members = data, members
        self.lr_scale = lr_scale.tolist()  # member k's rate = the group's lr x lr_scale[k]
        self.max_epochs, self.max_steps, self.max_time_s = max_epochs, max_steps, max_time_s
        self.flush_every_n_steps, self.flush_every_s = flush_every_n_steps, flush_every_s
        self.checkpoint_path, self.checkpoint_every_s, self.publish = checkpoint_path, checkpoint_every_s, publish
        self.stop = stop
        self.progress = progress  # perf.progress=line: a line an epoch, as a run alone prints (callbacks.progress)
        # CPU dropout as each member's run alone draws it (its own stream); elsewhere one draw for all.
        self.streams = [m.dropout_stream for m in members] if exact_dropout else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.grad = torch.zeros_like(p)  # kept, zeroed in place: parameters the shortcut leaves unused still step
        self.grads = [p.grad for p in self.params]
        self.global_step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.epoch_start_orders: Optional[list[torch.Tensor]] = None  # a resumed epoch replays its order
        self.losses: list[torch.Tensor] = []  # each step's (K,) losses, until flushed
        self.steps: list[int] = []
        self.times: list[int] = []
        self.last_flush = time.monotonic()
        self.last_checkpoint = time.monotonic()
        # trainer.max_time counts the pack's training across its starts (as Lightning's Timer does for a
        # run alone): the seconds of earlier starts come back with the checkpoint.
        self.elapsed_s = 0.0
        self._clock: Optional[float] = None  # monotonic time at which elapsed_s would have been 0

    def elapsed(self) -> float:
        return time.monotonic() - self._clock if self._clock is not None else self.elapsed_s

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> None:
        self._clock = time.monotonic() - self.elapsed_s
        self.model.train()
        while self.epoch < self.max_epochs and self._training():
            if self.epoch_start_orders is None:
                self.epoch_start_orders = [m.order.get_state() for m in self.members]
            else:  # resumed inside an epoch: the same order, from the batch it stopped at
                for m, state in zip(self.members, self.epoch_start_orders):
                    m.order.set_state(state)
            orders = self.data.orders(self.members)
            preds, targets = [], []
            first, epoch_s = self.batch_in_epoch, time.perf_counter()
            out_of_time = False
            for b in range(first, self.data.n_batches):
                if self.stop.signal is not None:
                    raise PackStopped(self.stop.signal, self.save(), self.global_step)
                x, y = self.data.batch(orders, b)
                losses, pred = self.step(x, y)
                self.global_step += 1
                self.batch_in_epoch = b + 1
                self.losses.append(losses.detach())  # references: read back together at the flush
                self.steps.append(self.global_step)
                self.times.append(int(time.time() * 1000))
                preds.append(pred.detach())
                targets.append(y)
                if len(self.losses) >= self.flush_every_n_steps and time.monotonic() - self.last_flush >= self.flush_every_s:
                    self.flush()
                if self.checkpoint_every_s > 0 and time.monotonic() - self.last_checkpoint >= self.checkpoint_every_s:
                    self.publish(self.save(), self.global_step)
                out_of_time = self.max_time_s is not None and self.elapsed() >= self.max_time_s
                if (0 < self.max_steps <= self.global_step) or out_of_time or not self._training():
                    break
            if self.x_device_is_cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - epoch_s
            self.flush()
            # A pack resumed from a checkpoint taken after an epoch's last step trains no step of that
            # epoch here: it still ends it (validation, best, patience), without train metrics of its own.
            trained = (torch.cat(preds, 1), torch.cat(targets, 1)) if preds else None
            self.end_epoch(seconds, self.batch_in_epoch - first, trained)
            self.epoch += 1
            self.batch_in_epoch, self.epoch_start_orders = 0, None
            if self.scheduler is not None:
                self.scheduler.step()
            if (0 < self.max_steps <= self.global_step) or out_of_time:
                break
        self.flush()
        self.elapsed_s, self._clock = self.elapsed(), None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step of every member, as MATLAB orders it: loss, backward, L2 and threshold, update."""
        torch._foreach_zero_(self.grads)
        pred = self.model.forward_one_step(x, self.streams)
        losses = self.loss_fn(pred, y)
        losses.sum().backward()  # member k's parameters get member k's gradient alone
        if self.gradients is not None:
            self.gradients()
        self.optimizer.step()
        return losses, pred

    @property
    def x_device_is_cuda(self) -> bool:
        return self.data.x.device.type == "cuda"

    def _training(self) -> bool:
        return any(m.active for m in self.members)

    # -- what each member's run gets -------------------------------------------------------------
    def flush(self) -> None:
        """Every waiting step's losses, read back in one go, to each training member's run; a member
        whose loss became NaN or Inf ends FAILED with the step (DivergenceCheck, member by member)."""
        self.last_flush = time.monotonic()
        if not self.losses:
            return
        table = torch.stack(self.losses).t().tolist()  # (K, steps): the one synchronisation
        steps, times = self.steps, self.times
        self.losses, self.steps, self.times = [], [], []
        group_lr = float(self.optimizer.param_groups[0]["lr"])  # a scheduler changes it between epochs only
        for m, values in zip(self.members, table):
            if not m.active:
                continue
            rmse = [math.sqrt(max(self.loss_to_mse(v), 0.0)) if math.isfinite(v) else v for v in values]
            lr = [group_lr * self.lr_scale[m.k]] * len(values)
            with m.own_failure("its step metrics", steps[0]):
                m.tracker.log_series({"train_loss": values, "train_rmse": rmse, "lr": lr}, steps, times)
            bad = next(((s, v) for s, v in zip(steps, values) if not math.isfinite(v)), None)
            if bad is not None:
                m.fail(DIVERGED.format(value=bad[1], step=bad[0]), bad[0])

    @torch.no_grad()
    def end_epoch(self, seconds: float, steps: int, trained: Optional[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Each training member's epoch as its callbacks record it alone: timing (the pack's time:
        what its steps took), the epoch's train metrics (`trained`: the predictions and targets of
        the steps taken; None when none were), validation, best, patience."""
        epoch, step = self.epoch + 1, self.global_step
        train = metrics_per_member(*trained) if trained is not None else {}
        val = self.validate()
        pack_rate = len(self.members) * steps / max(seconds, 1e-9)
        for m in self.members:
            if not m.active:
                continue
            row = {f"train_{k}_epoch": v[m.k] for k, v in train.items()}
            with m.own_failure("its epoch's metrics", step):
                if steps:
                    m.timed_epoch(seconds, steps, trained[0].shape[1], step)
                    row["pack_model_steps_per_s"] = pack_rate
                if val is not None:
                    row.update({f"val_{k}": v[m.k] for k, v in val.items()})
                m.tracker.log_metrics(row, step)
                if val is not None:
                    m.validated(val["rmse"][m.k], step, epoch, lambda k=m.k: self.model.member(k))
            if val is not None and m.status != "FAILED":
                m.reported(val["rmse"][m.k], step, epoch)  # a search's trial: its pruner may stop it here
                if not m.active:  # stopped early or pruned: its network is the one of this step
                    m.last_weights = self.model.member(m.k)
        if self.progress is not None:
            training = [m.k for m in self.members if m.active]
            parts = [f"epoch {epoch}/{self.max_epochs}", f"step {step}", f"{steps / max(seconds, 1e-9):,.0f} it/s",
                     f"{len(training)} of {len(self.members)} members training"]
            if val is not None and training:
                rmse = [val["rmse"][k] for k in training]
                parts.append(f"val_rmse {min(rmse):.4g}-{max(rmse):.4g}")
            self.progress.write("  ".join(parts) + "\n")
            self.progress.flush()

    @torch.no_grad()
    def validate(self) -> Optional[dict[str, list[float]]]:
        if self.data.val_rows is None:
            return None
        target = self.data.val_targets()
        self.model.eval()
        try:
            pred = torch.cat([self.model.forward_one_step(x) for x in self.data.val_chunks()], dim=1)
        finally:
            self.model.train()
        out = metrics_per_member(pred, target)
        out["loss"] = self.loss_fn(pred, target).tolist()
        return out

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "global_step": self.global_step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "epoch_start_orders": self.epoch_start_orders, "members": [m.state() for m in self.members],
            "torch_rng": torch.get_rng_state(), "elapsed_s": self.elapsed(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.global_step, self.epoch, self.batch_in_epoch = state["global_step"], state["epoch"], state["batch_in_epoch"]
        self.epoch_start_orders = state["epoch_start_orders"]
        for m, member_state in zip(self.members, state["members"]):
            m.load_state(member_state)
        torch.set_rng_state(state["torch_rng"])
        self.elapsed_s = state.get("elapsed_s", 0.0)  # a checkpoint from before issue 32 has none

    def save(self) -> Path:
        """The pack's checkpoint, written whole (a kill mid-write keeps the previous one). The steps
        trained so far are sent first: a resume continues after the checkpoint and does not send
        again what a run already holds, so a step trained before it must not be left unsent."""
        self.flush()
        self.last_checkpoint = time.monotonic()
        state = {**self.state_dict(), "run_ids": [m.run_id for m in self.members]}
        replace_atomically(self.checkpoint_path, lambda tmp: torch.save(state, tmp))
        return self.checkpoint_path


def metrics_per_member(pred: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """RMSE, MAE and R2 (averaged over responses, as torchmetrics' R2Score) of each member's
    predictions: (K, samples, responses) -> K values each."""
    err = (pred - target).double()
    target = target.double()
    sst = (target - target.mean(dim=1, keepdim=True)).pow(2).sum(dim=1)
    r2 = (1 - err.pow(2).sum(dim=1) / sst).mean(dim=1)
    return {"rmse": err.pow(2).mean(dim=(1, 2)).sqrt().tolist(), "mae": err.abs().mean(dim=(1, 2)).tolist(),
            "r2": r2.tolist()}
