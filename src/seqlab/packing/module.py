"""The pack's LightningModule (issues 22 and 32): K members of the network (packing.model.PackedCNNLSTM),
one optimizer step for all, driven by Lightning's Trainer as a run alone is. Lightning runs the
epochs, validation (each epoch, every N epochs or every N iterations), max_steps, max_time (counted
across a resume by its Timer), Ctrl-C/SIGTERM/USR2 (resume.interrupt.GracefulStop) and the
checkpoints (resume.checkpoints.TimedCheckpoint); each training_step runs the optimizer steps of
one item of `perf.steps_per_call` mini-batches, as the fused loop does for a run alone
(seqlab.training.loop):

    zero the gradients -> forward (K, batch) -> each member's loss -> backward of their sum
    -> MATLAB's L2 and threshold, clipping, per member -> one optimizer step over the packed tensors

Nothing is read back to the host per step: each step leaves its (K,) losses, read back together a
few times a second and sent to each member's run; a member whose loss became NaN or Inf ends
FAILED there, the others go on. What each member's callbacks would record alone (timing, best,
patience, time to target, a search's pruning) is kept per member (packing.members.Member), each
sent to its own run: Lightning's loggers hold one run."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

import pytorch_lightning as pl
import torch

from seqlab import SeqlabError
from seqlab.packing.data import PackData
from seqlab.packing.members import Member
from seqlab.packing.model import MEMBER_LOSSES, PackedCNNLSTM, share_streams
from seqlab.tracking.steps import StepLog
from seqlab.training.devices import synchronize
from seqlab.training.lightning_private import batches_done_in_epoch, count_optimizer_steps
from seqlab.training.loop import FusedLoop, lightning_steps

log = logging.getLogger("seqlab")

DIVERGED = (
    "the training loss became {value} at step {step}: training diverged; lower optimizer.lr, "
    "set module.gradient_threshold, or check the data"
)

Item = tuple[
    torch.Tensor, int, int
]  # every member's order this epoch (K, samples), its first and end batch


class PackItems:
    """The pack's training items, as Lightning iterates them: each pass draws every member's order
    (its own generator: its run alone's order) and serves items of `per_item` mini-batches. A pass
    resumed inside an epoch replays that epoch's order and skips the items it trained on."""

    def __init__(self, data: PackData, members: list[Member], per_item: int) -> None:
        self.data, self.members, self.per_item = data, members, max(per_item, 1)
        self.pass_start: Optional[list[torch.Tensor]] = (
            None  # the members' order states at this pass's start
        )
        self.resume_at: Optional[tuple[list[torch.Tensor], int]] = None

    def __len__(self) -> int:
        return math.ceil(self.data.n_batches / self.per_item)

    def __iter__(self) -> Iterator[Item]:
        skip = 0
        if self.resume_at is not None:
            states, skip = self.resume_at
            self.resume_at = None
            for m, state in zip(self.members, states):
                m.order.set_state(state)
        self.pass_start = [m.order.get_state() for m in self.members]
        orders = self.data.orders(self.members)
        for i in range(skip, len(self)):
            yield orders, i * self.per_item, min((i + 1) * self.per_item, self.data.n_batches)


class PackModule(pl.LightningModule):
    """Built by seqlab.packing.task with the packed network, its optimizer, schedule and gradient
    treatment (packing.optim), the members' data and the members."""

    def __init__(
        self,
        model: PackedCNNLSTM,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        gradients: Any,
        loss: str,
        loss_to_mse: Callable[[float], float],
        data: PackData,
        members: list[Member],
        *,
        lr_scale: torch.Tensor,
        steps_per_call: int,
        flush_every_n_steps: int,
        flush_every_s: float,
        exact_dropout: bool,
        cuda_graph: str = "auto",
        progress: Optional[TextIO] = None,
        end_member: Optional[Callable[[Member], Any]] = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = (
            False  # the item's steps are this module's own (as the fused loop's)
        )
        self.model = model
        self.packed_optimizer, self.scheduler, self.gradients = optimizer, scheduler, gradients
        self.loss_fn, self.loss_to_mse = MEMBER_LOSSES[loss], loss_to_mse
        self.cuda_graph = cuda_graph
        self.data, self.members = data, members
        self.items = PackItems(data, members, steps_per_call)
        self.lr_scale = lr_scale.tolist()  # member k's rate = the group's lr x lr_scale[k]
        self.flush_every_n_steps, self.flush_every_s = flush_every_n_steps, flush_every_s
        self.progress = progress  # perf.progress=line: a line an epoch, as a run alone prints (callbacks.progress)
        self.end_member = end_member  # a member's run ended where it stopped (packing.member_runs.finish_or_fail: its job alone's end)
        # CPU dropout as each member's run alone draws it (its own stream); elsewhere one draw for all.
        # Members whose runs alone would draw the very same masks (one seed, one rate) share one
        # stream object, so that the pack draws each mask once for them.
        self.streams = None
        if exact_dropout:
            shared = share_streams([m.dropout_stream for m in members], model.dropout)
            for m, stream in zip(members, shared):
                m.dropout_stream = stream
            self.streams = shared
        self.loop: Optional[FusedLoop] = (
            None  # a run alone's loop, with the member dimension; built as training starts
        )
        self.trained = 0  # optimizer steps trained: the step each member's run records
        self.step_log = StepLog()  # each step's (K,) losses, until flushed to the members' runs
        self.last_flush = time.monotonic()
        self.last_val: Optional[dict[str, list[float]]] = None
        self._epoch: dict[str, Any] = {}

    # -- Lightning's side ------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        if self.scheduler is None:
            return self.packed_optimizer
        # Saved and restored with the checkpoint by Lightning; stepped here each epoch (manual optimisation).
        return {
            "optimizer": self.packed_optimizer,
            "lr_scheduler": {"scheduler": self.scheduler, "interval": "epoch"},
        }

    def train_dataloader(self) -> PackItems:
        return self.items

    def val_dataloader(self) -> list:
        return (
            [0] if self.data.val_rows is not None else []
        )  # one call: the members' sets a chunk at a time

    def on_train_start(self) -> None:
        self.trained = self.trainer.global_step
        # The loop a run alone trains with (training.loop), over the packed network: (K,) losses, each
        # member's dropout stream, and its frozen members put back after each step.
        self.loop = FusedLoop(
            self.model,
            self.packed_optimizer,
            self.loss_fn,
            self.step_log,
            self.data.batch_size,
            gradients=self.gradients,
            cuda_graph=self.cuda_graph,
            dropout_streams=self.streams,
            after_step=self.after_step,
            **lightning_steps(self),
        )

    def on_validation_model_zero_grad(self) -> None:
        pass  # Lightning would free the gradients before validation; the loop keeps them (zeroed in place)

    def on_train_epoch_start(self) -> None:
        self._epoch = {"start": time.perf_counter(), "val_s": 0.0, "steps": 0, "closed": False}

    def training_step(self, item: Item, batch_idx: int) -> None:
        orders, first, stop = item
        if not self._epoch:  # resumed inside an epoch: Lightning does not start it again
            self.on_train_epoch_start()
        if self.trainer.max_steps > 0:
            stop = min(stop, first + self.trainer.max_steps - self.trained)
        n, _ = self.loop.run_batches(
            ((*self.data.batch(orders, b), None) for b in range(first, stop)), self.trained + 1
        )
        if not self.loop.counts_steps:  # Lightning's optimizer wrapper counts its own steps
            count_optimizer_steps(
                self.optimizers(), n
            )  # Lightning's global_step, max_steps, validation interval
        self._epoch["steps"] += n

    def after_step(self) -> None:
        """Each step's end (the loop calls it, outside any CUDA graph): the step counted; members that
        stopped early or were pruned put back where they stopped."""
        self.trained += 1
        for m in self.members:
            if m.last_weights is not None:  # stopped early or pruned: frozen where it stopped
                self.model.load_member(m.k, m.last_weights)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (
            len(self.step_log) >= self.flush_every_n_steps
            and time.monotonic() - self.last_flush >= self.flush_every_s
        ):
            self.flush()
        # The epoch's training part ends with its last item, at max_steps, or when Lightning stops
        # (trainer.max_time): before the validation Lightning then runs.
        if (
            batch_idx + 1 >= self.trainer.num_training_batches
            or 0 < self.trainer.max_steps <= self.trained
            or self.trainer.should_stop
        ):
            self._close_epoch()

    def on_validation_start(self) -> None:
        if (
            self._epoch and not self._epoch["closed"]
        ):  # inside an epoch (every N iterations): not its training time
            synchronize(self.data.x.device)
            self._epoch["val_from"] = time.perf_counter()

    def on_validation_end(self) -> None:
        if self._epoch.get("val_from") is not None:
            self._epoch["val_s"] += time.perf_counter() - self._epoch.pop("val_from")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        target = self.data.val_targets()
        pred = torch.cat([self.model(x) for x in self.data.val_chunks()], dim=1)
        self.last_val = metrics_per_member(pred, target)
        self.last_val["loss"] = self.loss_fn(pred, target).tolist()

    def on_validation_epoch_end(self) -> None:
        self._validated(self.last_val, self.trained, self.current_epoch + 1)
        if not any(m.active for m in self.members):
            self.trainer.should_stop = True  # every member diverged, stopped early or was pruned

    def on_train_epoch_end(self) -> None:
        self._close_epoch()  # an epoch a signal or max_time ended before its last item
        if self.scheduler is not None:
            self.scheduler.step()  # Lightning steps it only in automatic optimisation
        if self.progress is not None:
            self._progress_line()
        self.last_val, self._epoch = None, {}

    # -- what each member's run gets ---------------------------------------------------------------
    def flush(self, also: Sequence[Member] = ()) -> None:
        """Every waiting step's losses, read back in one go, to each training member's run; a member
        whose loss became NaN or Inf ends FAILED with the step (DivergenceCheck, member by member)."""
        self.last_flush = time.monotonic()
        if not len(self.step_log):
            return
        losses, steps, lrs, times = self.step_log.take()
        table = torch.stack(losses).t().tolist()  # (K, steps): the one synchronisation
        group_lrs = (
            torch.stack(lrs).tolist()
            if isinstance(lrs[0], torch.Tensor)
            else [float(lr) for lr in lrs]
        )
        for m, values in zip(self.members, table):
            if (
                not m.active and m not in also
            ):  # `also`: members stopped at the last step flushed, ending now
                continue
            rmse = [
                math.sqrt(max(self.loss_to_mse(v), 0.0)) if math.isfinite(v) else v for v in values
            ]
            lr = [group_lr * self.lr_scale[m.k] for group_lr in group_lrs]
            with m.own_failure("its step metrics", steps[0]):
                m.tracker.log_series(
                    {"train_loss": values, "train_rmse": rmse, "lr": lr}, steps, times
                )
            bad = next(((s, v) for s, v in zip(steps, values) if not math.isfinite(v)), None)
            if bad is not None:
                m.fail(DIVERGED.format(value=bad[1], step=bad[0]), bad[0])

    @torch.no_grad()
    def _close_epoch(self) -> None:
        """Each training member's epoch as its callbacks record it alone: timing (the pack's time: what
        its steps took, validation left out) and the epoch's train metrics."""
        epoch = self._epoch
        if not epoch or epoch["closed"]:
            return
        epoch["closed"] = True
        synchronize(self.data.x.device)
        seconds = max(time.perf_counter() - epoch["start"] - epoch["val_s"], 1e-9)
        self.flush()
        steps, step = epoch["steps"], self.trained
        # A pack resumed from a checkpoint taken after an epoch's last step trains no step of it here.
        trained = self.loop.take_epoch() if self.loop is not None else None
        epoch["rate"] = steps / seconds
        train = metrics_per_member(*trained) if trained is not None else {}
        for m in self.members:
            if not m.active:
                continue
            row = {f"train_{k}_epoch": v[m.k] for k, v in train.items()}
            with m.own_failure("its epoch's metrics", step):
                if steps:
                    m.timed_epoch(seconds, steps, trained[0].shape[1], step)
                    row["pack_model_steps_per_s"] = len(self.members) * steps / seconds
                if row:
                    m.tracker.log_metrics(row, step)

    def _validated(self, val: dict[str, list[float]], step: int, epoch: int) -> None:
        """Each training member after a validation: its metrics, best, patience, time to target, a
        search's pruning (Member.validated, reported). A member that stops here (patience, its
        pruner) ends its run now, as its run alone would (`end_member`), while the pack trains on."""
        stopped = []
        for m in self.members:
            if not m.active:
                continue
            with m.own_failure("its validation metrics", step):
                m.tracker.log_metrics({f"val_{k}": v[m.k] for k, v in val.items()}, step)
                m.validated(val["rmse"][m.k], step, epoch, lambda k=m.k: self.model.member(k))
            if m.status != "FAILED":
                m.reported(
                    val["rmse"][m.k], step, epoch
                )  # a search's trial: its pruner may stop it here
                if not m.active:  # stopped early or pruned: its network is the one of this step
                    m.last_weights = self.model.member(m.k)
                    stopped.append(m)
        if stopped and self.end_member is not None:
            # Every step so far reaches their runs first (each is one of theirs: they stopped at this one).
            self.flush(also=stopped)
            for m in stopped:
                self.end_member(m)

    def _progress_line(self) -> None:
        training = [m.k for m in self.members if m.active]
        parts = [
            f"epoch {self.current_epoch + 1}/{self.trainer.max_epochs}",
            f"step {self.trained}",
            f"{self._epoch.get('rate', 0.0):,.0f} it/s",
            f"{len(training)} of {len(self.members)} members training",
        ]
        if self.last_val is not None and training:
            rmse = [self.last_val["rmse"][k] for k in training]
            parts.append(f"val_rmse {min(rmse):.4g}-{max(rmse):.4g}")
        self.progress.write("  ".join(parts) + "\n")
        self.progress.flush()

    # -- checkpoints: the members and where in the epoch's order the pack stopped --------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The steps trained so far are sent first: a resume continues after the checkpoint and does not
        # send again what a run already holds, so a step trained before it must not be left unsent.
        self.flush()
        done = batches_done_in_epoch(self.trainer)
        if (
            done >= len(self.items) or self.items.pass_start is None
        ):  # the epoch is over: the next draws anew
            starts, done = None, 0
        else:
            starts = self.items.pass_start
        checkpoint["pack"] = {
            "run_ids": [m.run_id for m in self.members],
            "members": [m.state() for m in self.members],
            "epoch_start_orders": starts,
            "items_done": done,
            "torch_rng": torch.get_rng_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        pack = checkpoint.get("pack")
        if pack is None or pack["run_ids"] != [m.run_id for m in self.members]:
            raise SeqlabError(
                "the pack's checkpoint is another pack's: run the sweep again without resume="
            )
        if "model.conv_weight" in checkpoint.get("state_dict", {}):
            # Written before 2026-12-04, when the convolution's taps were one packed tensor (and
            # the optimizer's state one tensor for them): not this version's layout.
            raise SeqlabError(
                "the pack's checkpoint was written by an older seqlab (before 2026-12-04): "
                "continue it with that version, or run the sweep again without resume="
            )
        for m, state in zip(self.members, pack["members"]):
            m.load_state(state)
            if (
                m.ended_before and m.active
            ):  # its run ended after this checkpoint: it stays as it ended, frozen
                m.active = False
                if m.status == "FAILED":
                    m.reason = m.reason or "failed in an earlier start of its pack"
        if pack["epoch_start_orders"] is not None:
            self.items.resume_at = (pack["epoch_start_orders"], pack["items_done"])
        torch.set_rng_state(pack["torch_rng"])
        pack_id = self.members[0].job.pack_id if self.members[0].job is not None else "-"
        log.info(
            "resume    pack %s continues its %d members from step %d",
            pack_id,
            len(self.members),
            checkpoint.get("global_step", 0),
        )


def metrics_per_member(pred: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """RMSE, MAE and R2 (averaged over responses, as torchmetrics' R2Score) of each member's
    predictions: (K, samples, responses) -> K values each."""
    err = (pred - target).double()
    target = target.double()
    sst = (target - target.mean(dim=1, keepdim=True)).pow(2).sum(dim=1)
    r2 = (1 - err.pow(2).sum(dim=1) / sst).mean(dim=1)
    return {
        "rmse": err.pow(2).mean(dim=(1, 2)).sqrt().tolist(),
        "mae": err.abs().mean(dim=(1, 2)).tolist(),
        "r2": r2.tolist(),
    }
