"""One member of a pack as the run it is (issue 22, point 4): its config, its job (folder, result
file), its MLflow run, its data and network built as its run alone builds them, and what its
callbacks would keep when it trains alone (epoch timing, best val_rmse and the network to keep,
time to target, validation patience), in plain Python: the pack's module (seqlab.packing.module) hands
each member its own numbers, and a member ends (diverged, stopped early) without the others."""

from __future__ import annotations

import copy
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from seqlab import one_line
from seqlab.callbacks.best import BestSoFar
from seqlab.callbacks.timing import epoch_median, reached
from seqlab.sweeps.job import Job
from seqlab.sweeps.pruning import reported
from seqlab.sweeps.trial import PRUNED_AT, TrialLink
from seqlab.tracking.lifecycle import Opening
from seqlab.tracking.model_logging import Kept, log_new_best

log = logging.getLogger("seqlab")


@dataclass
class Member:
    k: int  # its place in the pack
    cfg: DictConfig  # its own config: the pack job's with its packable overrides
    job: Job  # its own folder and result file
    tracker: Any = None  # its MLflow run (tracking.MlflowTracker)
    name: str = ""
    opening: Optional[Opening] = (
        None  # what its run opened with: name, tags, params (tracking.lifecycle)
    )
    datamodule: Any = None  # data.SeqDataModule, set up as its run alone sets it up
    network: Any = (
        None  # model.CNNLSTM: built as its run alone builds it; at the end, the network it keeps
    )
    dropout_stream: Optional[torch.Generator] = (
        None  # the global stream its run alone would draw dropout from
    )
    order: Optional[torch.Generator] = None  # its data order (data.module.TensorBatches' generator)
    resume_run_id: Optional[str] = None  # continue this KILLED run from the pack's checkpoint
    # Its run ended FAILED in an earlier start of this pack (diverged before a Ctrl-C): the continued
    # pack keeps its slot, frozen, and neither reopens nor trains its run again.
    ended_before: bool = False
    trial_link: Optional[TrialLink] = (
        None  # a search's trial this member trains (seqlab.sweeps.trial)
    )
    trial: Any = None  # that optuna.Trial, opened when its run starts
    status: str = "RUNNING"  # RUNNING | FINISHED | FAILED | KILLED
    reason: Optional[str] = None
    active: bool = True  # still training (False: diverged or stopped early; the pack goes on)
    # What its callbacks keep when it trains alone (callbacks.timing, best, output_network):
    epochs: list[dict[str, float]] = field(
        default_factory=list
    )  # epoch_time_s, it_per_s, samples_per_s
    trained_s: float = 0.0
    record: BestSoFar = field(
        default_factory=BestSoFar
    )  # its best val_rmse and the validations since (patience)
    best_weights: Optional[dict[str, torch.Tensor]] = None
    reached: Optional[dict[str, float]] = None
    stopped: Optional[dict[str, int]] = None  # stopped early by module.validation_patience
    pruned: Optional[str] = None  # why a search's pruner stopped it (its job result's reason)
    final_step: Optional[int] = None  # where its training ended (stopped early: there)
    last_weights: Optional[dict[str, torch.Tensor]] = None  # its weights where it stopped early
    logged: list[tuple[str, int]] = field(
        default_factory=list
    )  # logger.log_checkpoints=all: (model id, step) logged

    @property
    def run_id(self) -> Optional[str]:
        return self.tracker.run_id if self.tracker is not None else self.resume_run_id

    @property
    def best(self) -> Optional[dict[str, float]]:
        return self.record.best

    @property
    def run_open(self) -> bool:
        """Its run is open in this process (it has not ended it, nor ended it before)."""
        return (
            self.tracker is not None
            and self.tracker.run_id is not None
            and (self.job.result is None or self.job.result.status == "RUNNING")
        )

    def state(self) -> dict[str, Any]:
        """What a pack checkpoint keeps of this member besides its packed weights: its status too,
        so that a member that failed before the checkpoint stays FAILED after a resume."""
        return {
            "status": self.status,
            "reason": self.reason,
            "epochs": self.epochs,
            "trained_s": self.trained_s,
            "best": self.record.best,
            "best_weights": self.best_weights,
            "since_best": self.record.since_best,
            "reached": self.reached,
            "stopped": self.stopped,
            "pruned": self.pruned,
            "active": self.active,
            "final_step": self.final_step,
            "last_weights": self.last_weights,
            "logged": self.logged,
            "order": self.order.get_state(),
            "dropout_stream": self.dropout_stream.get_state()
            if self.dropout_stream is not None
            else None,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        for key in (
            "epochs",
            "trained_s",
            "best_weights",
            "reached",
            "stopped",
            "pruned",
            "active",
            "final_step",
            "last_weights",
        ):
            setattr(self, key, state[key])
        self.record.best, self.record.since_best = state["best"], state["since_best"]
        self.logged = state.get(
            "logged", []
        )  # a checkpoint from before logged checkpoints has none
        if state.get("status") == "FAILED":  # KILLED or RUNNING then: it trains on as RUNNING now
            self.status, self.reason = "FAILED", state.get("reason")
        self.order.set_state(state["order"])
        if self.dropout_stream is not None and state["dropout_stream"] is not None:
            self.dropout_stream.set_state(state["dropout_stream"])

    @contextmanager
    def own_failure(self, what: str, step: Optional[int] = None):
        """What this member sends to its own run: a failure there (its run deleted in the UI, a write or
        upload its store refuses) ends this member FAILED with the reason, and the pack goes on."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 - one member's store, not the pack's training
            self.fail(f"its MLflow run refused {what}: {one_line(error)}", step)

    def fail(self, reason: str, step: Optional[int] = None) -> None:
        if self.status == "FAILED":
            return
        self.active, self.status, self.reason = False, "FAILED", reason
        self.final_step = self.final_step or step
        log.warning("failed    member %d (%s): %s; the pack goes on", self.k, self.name, reason)

    # -- an epoch's end, as the member's callbacks see it --------------------------------------
    def timed_epoch(self, seconds: float, steps: int, samples: int, step: int) -> None:
        """callbacks.timing.EpochTimer: this epoch's training time (the pack's: what it took)."""
        seconds = max(seconds, 1e-9)
        row = {
            "epoch_time_s": seconds,
            "it_per_s": steps / seconds,
            "samples_per_s": samples / seconds,
        }
        self.epochs.append(row)
        self.trained_s += seconds
        self.tracker.log_metrics(row, step)

    def validated(self, val_rmse: float, step: int, epoch: int, weights: Any) -> None:
        """callbacks.best.BestValRmse, output_network.OutputNetwork and timing.TimeToTarget after a
        validation; `weights()` gives the member's state dict (taken only for a new best)."""
        if self.reached is None:
            self.reached = reached(
                self.cfg.metrics.target_rmse, val_rmse, self.trained_s, step, epoch
            )
            if self.reached is not None:
                self.tracker.log_metrics(self.reached, step)
        self.record.patience = self.cfg.module.validation_patience
        if self.record.offer(val_rmse, step, epoch):
            self.tracker.log_metrics(self.record.best, step)
            checkpoints = self.tracker.log_checkpoints
            if self.cfg.module.output_network == "best" or checkpoints in ("best", "all"):
                self.best_weights = weights()
            if checkpoints == "all":
                self._log_checkpoint(step)
            return
        if self.record.out_of_patience and self.active:
            self.active, self.final_step = False, step
            self.stopped = {"step": step, "epoch": epoch}
            log.info(
                "stopped   member %d early at step %d (epoch %d): val_rmse has not improved for %d validation(s) "
                "(module.validation_patience=%d); the pack goes on",
                self.k,
                step,
                epoch,
                self.record.since_best,
                self.record.patience,
            )

    def _log_checkpoint(self, step: int) -> None:
        """logger.log_checkpoints=all: this new best as a logged model now, as OutputNetwork logs a
        run's alone (its metrics are linked at the end)."""
        network = copy.deepcopy(self.network)
        network.load_state_dict(self.best_weights)
        done = log_new_best(self.tracker, network, self.datamodule.example_x, step)
        if done is not None:
            self.logged.append(done)

    def reported(self, val_rmse: float, step: int, epoch: int) -> None:
        """sweeps.pruning.TrialReporter: a search's trial gets the epoch's val_rmse, and where the
        pruner gives up on it the member stops at this step (its run ends as a pruned trial's:
        FINISHED, tagged trial_state=PRUNED) while the pack goes on."""
        if self.trial is None or not self.active or not math.isfinite(val_rmse):
            return
        prune = reported(self.trial, val_rmse, epoch, self.trial_link.number)
        if prune is None:
            self.trial = None  # the study ended it meanwhile: the member trains on without reports
        if not prune:
            return
        self.active, self.final_step = False, step
        self.trial.set_user_attr(PRUNED_AT, epoch)
        self.tracker.log_metrics({PRUNED_AT: float(epoch)}, step)
        self.tracker.set_tags({"trial_state": "PRUNED", PRUNED_AT: epoch})
        n = self.trial_link.number
        self.pruned = f"trial {n} pruned at epoch {epoch} (val_rmse {val_rmse:.4g}): worse than the trials before it"
        log.info(
            "pruned    trial %d (member %d) at epoch %d of %d: val_rmse %.4g is worse than the trials before it at "
            "that epoch; the pack goes on",
            n,
            self.k,
            epoch,
            self.cfg.trainer.max_epochs,
            val_rmse,
        )

    def median(self, key: str) -> Optional[float]:
        """callbacks.timing.EpochTimer.median: over epochs, the first left out when there are others."""
        return epoch_median([r[key] for r in self.epochs])

    def kept(
        self, last: dict[str, torch.Tensor], step: int
    ) -> tuple[dict[str, torch.Tensor], Kept]:
        """The network the run ends with and which it is (OutputNetwork.restore)."""
        if self.last_weights is not None:  # stopped early: the pack trained on, this member did not
            last, step = self.last_weights, self.final_step
        stopped = (
            f"step {self.stopped['step']} (epoch {self.stopped['epoch']})"
            if self.stopped is not None
            else None
        )
        if self.cfg.module.output_network == "best" and self.best_weights is not None:
            return self.best_weights, Kept(
                "best",
                int(self.best["best_val_rmse_step"]),
                int(self.best["best_val_rmse_epoch"]),
                stopped,
            )
        return last, Kept("last", step, stopped_early=stopped)
