"""The LightningModule of every job (issue 32): a network of K >= 1 members, trained in one step.
A run alone is a pack of one (packing.model.OneMember: its network as member 0); a pack's K CNN-LSTMs
are one packed module (PackedCNNLSTM). Lightning's Trainer drives the epochs, validation (each
epoch, every N epochs or every N iterations), max_steps, max_time (its Timer's state is in the
checkpoint, so it counts across starts), signals, precision and checkpoints, for every job alike.

Two ways to step, one module:

- perf=fast (the default): each training_step runs one item of `perf.steps_per_call` mini-batches
  in the fused loop (seqlab.training.loop.FusedLoop), every member's batches from the job's data on
  the device (packing.data.PackData), each member's order its run alone's:

      zero the gradients -> forward (K, batch) -> each member's loss -> backward of their sum
      -> MATLAB's L2 and threshold, clipping, per member -> one optimizer step for all

  Under DDP the same loop, each process on its share of every member's epoch (PackData.shard),
  the gradients averaged over the processes after each backward (seqlab.ddp.gradients).

- perf=naive: Lightning's automatic optimisation, one step a call, the batches from the data
  module's loader (a DataLoader over a TensorDataset, the setup people write first; under DDP with
  Lightning's DistributedSampler). One member.

Nothing is read back to the host per step: each step leaves its (K,) losses in the step log, which
tracking.StepMetricsRecorder reads back a few times a second and sends to each member's run. A
validation predicts every member's own validation set in one call; its metrics go to each member's
run, and what the callbacks make of them (seqlab.callbacks: best, patience, time to target; a
search's pruning) is theirs, member by member. A member that stops (patience, its pruner, a loss
that became NaN) is frozen where it stopped while the others train on; its run ends at the epoch's
end (a failed one's with the job), or with the job when no member trains any more."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
from torch import nn

from seqlab import SeqlabError
from seqlab.ddp.gradients import AverageGradients, without_reducer
from seqlab.packing.data import PackData, PackItems
from seqlab.packing.members import Member
from seqlab.packing.model import share_streams
from seqlab.packing.optim import Update
from seqlab.training.evaluation import MEMBER_LOSSES, metrics_per_member
from seqlab.training.lightning_private import (
    batches_done_in_epoch,
    count_optimizer_steps,
    unscale_for_treatment,
)
from seqlab.training.loop import FusedLoop, lightning_steps
from seqlab.training.profiling import phase

log = logging.getLogger("seqlab")


class SeqRegressor(pl.LightningModule):
    """Built by seqlab.train from conf/module/ (a partial: the loss; MATLAB's L2 and threshold, each
    member's own where a pack's members differ in them) with the network of the job's members, the
    members, their data and how their update is made (`update`, called as training is configured:
    packing.optim.build_update). `loop`: a partial of the fused loop (perf=fast), or None for
    Lightning's automatic optimisation (perf=naive) over `batches` (a loader of the one member's
    data module)."""

    def __init__(
        self,
        model: nn.Module,
        members: list[Member],
        data: PackData,
        update: Callable[..., Update],
        loss: str = "half_mse",
        l2_regularization: Any = 0.0,
        gradient_threshold: Any = None,
        gradient_threshold_method: str = "l2norm",
        bn_statistics: str = "moving",  # read at each member's end (training.evaluation.final_metrics)
        output_network: str = "last",  # read by the callbacks group's `best` (conf/callbacks/)
        validation_patience: Optional[int] = None,  # likewise
        *,
        step_log: Any = None,
        loop: Optional[Callable[..., FusedLoop]] = None,
        batches: Optional[Callable[[], Any]] = None,
        exact_dropout: bool = False,
        loss_on_progress_bar: bool = False,
    ) -> None:
        super().__init__()
        self.automatic_optimization = loop is None
        self.model, self.members, self.data = model, members, data
        self.loss_fn = MEMBER_LOSSES[loss]
        self.loss_name = loss
        k = len(members)
        # Per member (a pack's members may differ in these: packable keys), else the job's.
        self.l2 = _per_member(l2_regularization, k)
        self.threshold = _per_member(gradient_threshold, k)
        self.threshold_method = gradient_threshold_method
        self.make_update, self.update = update, None
        self.step_log = step_log
        self.loop_factory, self.loop = loop, None  # the fused loop, built as training starts
        self.batches, self.loss_on_progress_bar = batches, loss_on_progress_bar
        self.items = PackItems(data, members, 1) if loop is not None else None
        # CPU dropout as each pack member's run alone draws it (its own stream); a run alone draws
        # from the global stream itself. Members whose runs alone would draw the very same masks
        # (one seed, one rate) share one stream object, so that the pack draws each mask once.
        self.streams = None
        if exact_dropout and k > 1:
            self.streams = share_streams([m.dropout_stream for m in members], model.dropout)
            for m, stream in zip(members, self.streams):
                m.dropout_stream = stream
        self.trained = 0  # optimizer steps trained: the step each member's run records
        self.samples_trained = 0  # samples per member the steps have used (callbacks.timing)
        self.last_loss: Optional[torch.Tensor] = None  # the last step's (K,) losses (progress)
        self.val: Optional[dict[str, list[float]]] = None  # the last validation's, per member
        self.resuming = False  # the checkpoint fit starts from is these runs' own (not ckpt_path=)
        self.end_member: Optional[Callable[[Member], Any]] = None  # its run's end (seqlab.train)
        # A packed search with hydra.sweeper.refill: what gives freed slots to the study's next
        # trials (packing.refill.SlotFiller, set by seqlab.train).
        self.slots: Any = None
        self.retired: list[Member] = []  # members whose slots others took
        self.none_left = False  # every member stopped (members_stopped)
        self.epoch_preds: list[torch.Tensor] = []  # automatic optimisation's, for train metrics
        self.epoch_targets: list[torch.Tensor] = []
        self._closed = False  # this epoch's train metrics are sent

    def set_items_per_call(self, per_item: int) -> None:
        if self.items is not None:
            self.items.per_item = max(per_item, 1)

    # -- Lightning's side ------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        # Built here, where Lightning has put the network on its device (each process's, under DDP).
        self.update = self.make_update(
            self.model, l2=self.l2, threshold=self.threshold, method=self.threshold_method
        )
        for m, scale in zip(self.members, self.update.lr_scale):
            m.lr_scale = scale
        if self.update.scheduler is None:
            return self.update.optimizer
        # Saved and restored with the checkpoint by Lightning; stepped each epoch (by Lightning in
        # automatic optimisation, by on_train_epoch_end otherwise).
        return {
            "optimizer": self.update.optimizer,
            "lr_scheduler": {"scheduler": self.update.scheduler, "interval": "epoch"},
        }

    def train_dataloader(self) -> Any:
        return self.items if self.items is not None else self.batches()

    def val_dataloader(self) -> list:
        # One call: the members' sets a chunk at a time.
        return [0] if self.data.val_rows is not None else []

    def on_fit_start(self) -> None:
        # trainer.precision=64-true: Lightning made the network double before fit; the data follows.
        self.data = self.data.cast(next(self.model.parameters()).dtype)
        # Under DDP each process trains its share of every member's epoch.
        self.data = self.data.shard(self.trainer.global_rank, self.trainer.world_size)
        if self.streams is not None and self.trainer.world_size > 1:
            # A member's DDP job alone draws its dropout from the global stream, which Lightning
            # seeds anew as the processes start (reset_seed: the seed of seed_everything).
            for m in self.members:
                m.dropout_stream.manual_seed(m.cfg.seed)
        if self.items is not None:
            self.items.data = self.data

    def on_train_start(self) -> None:
        self.trained = self.trainer.global_step
        if self.loop_factory is None:
            return
        self.loop = self.loop_factory(
            model=self.model,
            optimizer=self.update.optimizer,
            loss_fn=self.loss_fn,
            step_log=self.step_log,
            batch_size=self.data.batch_size,
            gradients=self.update.gradients,
            dropout_streams=self.streams,
            after_step=self.after_step,
            average_gradients=(
                AverageGradients(self.trainer.world_size) if self.trainer.world_size > 1 else None
            ),
            **lightning_steps(self),
        )

    def on_validation_model_zero_grad(self) -> None:
        # Lightning frees gradients before validation; the fused loop keeps them (zeroed in place
        # each step), so that a captured CUDA graph's gradient tensors stay the live ones.
        if self.automatic_optimization:
            super().on_validation_model_zero_grad()

    def on_train_epoch_start(self) -> None:
        self._closed = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.loop is None:
            return self._automatic_step(batch)
        orders, first, stop = batch
        if self.trainer.max_steps > 0:
            stop = min(stop, first + self.trainer.max_steps - self.trained)
        with without_reducer(self.trainer.strategy.model):  # DDP: the loop averages (ddp.gradients)
            n, loss = self.loop.run_batches(
                self.data.batches(orders, first, stop), self.trained + 1
            )
        if not self.loop.counts_steps:  # Lightning's optimizer wrapper counts its own steps
            # Lightning's global_step, max_steps and validation interval advance by the n steps.
            count_optimizer_steps(self.optimizers(), n)
        self.samples_trained += max(
            min(stop * self.data.batch_size, self.data.n_samples) - first * self.data.batch_size, 0
        )
        self.last_loss = loss
        return loss

    def _automatic_step(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One step of Lightning's automatic optimisation (perf=naive): the one member's
        batch, its loss; Lightning runs the backward, the gradient treatment and clipping
        (configure_gradient_clipping) and the optimizer."""
        x, y, *rest = batch
        lengths = rest[0].unsqueeze(0) if rest else None
        self.samples_trained += len(x)
        with phase("forward"):
            pred = self.model(x.unsqueeze(0), None, lengths)
            loss = self.loss_fn(pred, y.unsqueeze(0))
        self.epoch_preds.append(pred.detach())
        self.epoch_targets.append(y.unsqueeze(0))
        if self.loss_on_progress_bar:  # perf=naive: what a first Lightning module does
            self.log("loss", loss[0], prog_bar=True, logger=False, on_step=True, on_epoch=False)
        with phase("logging"):
            # Called before Lightning's optimizer step: this step is global_step + 1.
            self.step_log.add(
                loss.detach(),
                self.global_step + 1,
                self.trainer.optimizers[0].param_groups[0]["lr"],
            )
        self.last_loss = loss.detach()
        return loss.sum()

    def after_step(self) -> None:
        """Each fused step's end (the loop calls it, outside any CUDA graph): the step counted;
        members that stopped put back where they stopped."""
        self.trained += 1
        for m in self.members:
            if m.last_weights is not None:  # stopped early or pruned: frozen where it stopped
                self.model.load_member(m.k, m.last_weights)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.loop is None:
            self.trained = self.trainer.global_step
        # The epoch's training part ends with its last item, at max_steps, or when Lightning stops
        # (trainer.max_time): its train metrics before the validation Lightning then runs.
        if (
            batch_idx + 1 >= self.trainer.num_training_batches
            or 0 < self.trainer.max_steps <= self.trained
            or self.trainer.should_stop
        ):
            self._close_epoch()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        target = self.data.val_targets()
        pred = torch.cat([self.model(x, None, n) for x, n in self.data.val_chunks()], dim=1)
        self.val = metrics_per_member(pred, target)
        self.val["loss"] = self.loss_fn(pred, target).tolist()
        if self.trainer.sanity_checking:
            return
        for m in self.members:
            if m.active:
                with m.own_failure("its validation metrics", self.trained):
                    m.tracker.log_metrics(
                        {f"val_{k}": v[m.k] for k, v in self.val.items()}, m.own_step(self.trained)
                    )

    def on_train_epoch_end(self) -> None:
        self._close_epoch()  # an epoch a signal or max_time ended before its last item
        if not self.automatic_optimization and self.update.scheduler is not None:
            self.update.scheduler.step()  # Lightning steps it only in automatic optimisation
        epoch = self.trainer.current_epoch + 1
        if self.slots is not None:
            self.slots.end_own_epochs(self, epoch)
        # Members that stopped this epoch (patience, pruned) end their runs now, as their runs
        # alone would end, while the others train on; the last ones end with the job. One that
        # failed (its loss diverged) ends with the job: its run takes the job's checkpoints, which
        # keep it FAILED in its slot when the job is continued. Where slots are refilled, every
        # member that stopped ends now: its slot goes to the next trial.
        refills = self.slots is not None
        if self.end_member is not None and (refills or any(m.active for m in self.members)):
            for m in self.members:
                if not m.active and m.run_open and (m.status != "FAILED" or refills):
                    self.end_member(m)
        if refills:
            self.slots.refill(self, epoch)

    def members_stopped(self, trainer: pl.Trainer) -> None:
        """A callback stopped members (Member.stop, Member.fail): training stops once none trains."""
        if not any(m.active for m in self.members):
            trainer.should_stop = self.none_left = True

    @torch.no_grad()
    def _close_epoch(self) -> None:
        """Each training member's epoch train metrics (over the epoch's predictions), once."""
        if self._closed:
            return
        self._closed = True
        if self.loop is not None:
            trained = self.loop.take_epoch()
        elif self.epoch_preds:
            trained = torch.cat(self.epoch_preds, 1), torch.cat(self.epoch_targets, 1)
            self.epoch_preds, self.epoch_targets = [], []
        else:
            trained = None
        if trained is None:  # resumed from a checkpoint after an epoch's last step
            return
        train = metrics_per_member(*(self._every_process(t) for t in trained))
        for m in self.members:
            if m.active:
                with m.own_failure("its epoch's metrics", self.trained):
                    m.tracker.log_metrics(
                        {f"train_{k}_epoch": v[m.k] for k, v in train.items()},
                        m.own_step(self.trained),
                    )

    def _every_process(self, per_member: torch.Tensor) -> torch.Tensor:
        """(K, samples, ...) of this process's share -> every process's (DDP), so that the epoch's
        train metrics are the whole epoch's, as a run alone's are; this process's alone otherwise."""
        if self.trainer.world_size == 1:
            return per_member
        # Equal shares (PackData.shard): every process's is this one's shape.
        parts = [torch.empty_like(per_member) for _ in range(self.trainer.world_size)]
        torch.distributed.all_gather(parts, per_member.contiguous())
        return torch.cat(parts, dim=1)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The fused loop through Lightning's optimizer (mixed precision): its gradient treatment
        # here, inside the step, on the gradients unscaled.
        if self.loop is not None and self.loop.counts_steps and self.update.gradients is not None:
            unscale_for_treatment(self.trainer, optimizer)
            self.update.gradients()

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Optional[float] = None,
        gradient_clip_algorithm: Optional[str] = None,
    ) -> None:
        # Automatic optimisation: Lightning calls this after backward and before the optimizer
        # step, which is where MATLAB adds the L2 term and applies the threshold (in that order).
        if self.update.gradients is not None:
            unscale_for_treatment(self.trainer, optimizer)
            self.update.gradients()
        if gradient_clip_val:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

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

    # -- checkpoints: the members, where in the epoch's orders training stopped, the streams -------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        done = batches_done_in_epoch(self.trainer)
        starts = None
        if self.items is not None and self.items.pass_start is not None and done < len(self.items):
            starts = self.items.pass_start  # inside an epoch: a resume replays its order
        else:
            done = 0  # the epoch is over: the next one draws anew
        checkpoint["members"] = {
            "run_ids": [m.run_id for m in self.members],
            "states": [m.state() for m in self.members],
            "epoch_start_orders": starts,
            "items_done": done,
        }
        # Dropout draws from the global generators (a run alone's): a resumed run continues them.
        checkpoint["rng_states"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["rng_states"]["cuda"] = torch.cuda.get_rng_state_all()
        if self.batches is not None:  # automatic optimisation: the data module's order
            checkpoint["train_order"] = self.members[0].datamodule.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("members")
        if saved is None:
            # Written before 2026-12-04, when a run alone and a pack trained in modules of their
            # own: not this version's layout.
            raise SeqlabError(
                "the checkpoint was written by an older seqlab (before 2026-12-04): continue it "
                "with that version, or start again without resume= or ckpt_path="
            )
        if len(saved["states"]) != len(self.members):
            raise SeqlabError(
                f"the checkpoint holds {len(saved['states'])} member(s) and this job {len(self.members)}: "
                "it is another job's"
            )
        if self.resuming and saved["run_ids"] != [m.run_id for m in self.members]:
            raise SeqlabError(
                "the checkpoint is another pack's: run the sweep again without resume="
            )
        for m, state in zip(self.members, saved["states"]):
            m.load_state(state)
            if m.ended_before and m.active:  # its run ended after this checkpoint: it stays ended
                m.active = False
                if m.status == "FAILED":
                    m.reason = m.reason or "failed in an earlier start of its pack"
        if saved["epoch_start_orders"] is not None and self.items is not None:
            self.items.resume_at = (saved["epoch_start_orders"], saved["items_done"])
        states = checkpoint.get("rng_states") or {}
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        if "train_order" in checkpoint and self.batches is not None:
            self.members[0].datamodule.load_state_dict(checkpoint["train_order"])
        if len(self.members) > 1:
            first = self.members[0]
            log.info(
                "resume    pack %s continues its %d members from step %d",
                first.job.pack_id if first.job is not None else "-",
                len(self.members),
                checkpoint.get("global_step", 0),
            )


def _per_member(value: Any, k: int) -> list:
    """A setting as each member's: a list (a pack's members' own) as it is, else the job's for all."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * k
