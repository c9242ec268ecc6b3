"""One member of a job as the run it is (issues 22 and 32): a run alone is a job of one member, a
pack's K members share one packed step. Its config, its job (folder, result file), its MLflow run,
its data and network built as its run alone builds them, and what the callbacks record of it
(epoch timing, best val_rmse and the network to keep, time to target, patience, a search's
pruning: seqlab.callbacks and seqlab.sweeps.pruning, member by member), so that a member ends
(diverged, stopped early, pruned) without the others, and a checkpoint keeps it as it was."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from seqlab import one_line
from seqlab.callbacks.best import BestSoFar
from seqlab.sweeps.job import Job
from seqlab.sweeps.trial import TrialLink
from seqlab.tracking.lifecycle import Opening
from seqlab.tracking.model_logging import Kept
from seqlab.tracking.records import Best, EpochTiming, Reached, Stopped

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
    epochs: list[EpochTiming] = field(default_factory=list)  # the epochs it trained
    record: BestSoFar = field(
        default_factory=BestSoFar
    )  # its best val_rmse and the validations since (patience)
    best_weights: Optional[dict[str, torch.Tensor]] = None
    reached: Optional[Reached] = None  # where its val_rmse first reached metrics.target_rmse
    stopped: Optional[Stopped] = None  # stopped early by module.validation_patience
    pruned: Optional[str] = None  # why a search's pruner stopped it (its job result's reason)
    final_step: Optional[int] = None  # where its training ended (stopped early: there)
    last_weights: Optional[dict[str, torch.Tensor]] = None  # its weights where it stopped early
    logged: list[tuple[str, int]] = field(
        default_factory=list
    )  # logger.log_checkpoints=all: (model id, step) logged
    lr_scale: float = (
        1.0  # its learning rate as a multiple of the optimizer's (packing.optim.Update)
    )
    # Where in the pack's training it started: 0 for the pack's own members; a search's trial that
    # took the slot of a pruned member (hydra.sweeper.refill) starts at the pack's step, epoch and
    # training time of that moment, and its run counts its own from 1 (`own_step`, `own_epoch`).
    start_step: int = 0
    start_epoch: int = 0
    start_s: float = 0.0

    def own_step(self, step: int) -> int:
        """The pack's optimizer step `step` as this member's run counts it."""
        return step - self.start_step

    def own_epoch(self, epoch: int) -> int:
        """The pack's epoch `epoch` (from 1) as this member's run counts it."""
        return epoch - self.start_epoch

    @property
    def run_id(self) -> Optional[str]:
        return self.tracker.run_id if self.tracker is not None else self.resume_run_id

    @property
    def best(self) -> Optional[Best]:
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
        so that a member that failed before the checkpoint stays FAILED after a resume. Plain
        values and tensors: a checkpoint holds no class of this project to unpickle."""
        return {
            "status": self.status,
            "reason": self.reason,
            "epochs": [asdict(r) for r in self.epochs],
            "best": _plain(self.record.best),
            "best_weights": self.best_weights,
            "since_best": self.record.since_best,
            "reached": _plain(self.reached),
            "stopped": _plain(self.stopped),
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
        for key in ("best_weights", "pruned", "active", "final_step", "last_weights"):
            setattr(self, key, state[key])
        self.epochs = [EpochTiming(**r) for r in state["epochs"]]
        self.reached = _typed(Reached, state["reached"])
        self.stopped = _typed(Stopped, state["stopped"])
        self.record.best, self.record.since_best = _typed(Best, state["best"]), state["since_best"]
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
        if self.job is not None and self.job.member is not None:  # a run alone's error ends its job
            log.warning("failed    member %d (%s): %s; the pack goes on", self.k, self.name, reason)

    def stop(self, step: int, weights: dict[str, torch.Tensor]) -> None:
        """Its training ends at `step` (patience, its pruner): frozen there, with these weights,
        while the others train on (SeqRegressor.after_step puts them back after each step)."""
        self.active, self.final_step, self.last_weights = False, step, weights

    def trains_at(self, step: int) -> bool:
        """Whether it trained up to `step`: still training, or stopped right there (not failed)."""
        return self.status != "FAILED" and (self.active or self.final_step == step)

    def timing(self) -> Optional[EpochTiming]:
        """Its rates' medians over the epochs it trained (EpochTiming.median_of)."""
        return EpochTiming.median_of(self.epochs)

    def kept(
        self, last: dict[str, torch.Tensor], step: int
    ) -> tuple[dict[str, torch.Tensor], Kept]:
        """The network the run ends with and which it is (OutputNetwork.restore); `step`: the
        pack's last."""
        if self.last_weights is not None:  # stopped early: the pack trained on, this member did not
            last, step = self.last_weights, self.final_step
        step = self.own_step(step)
        stopped = (
            f"step {self.stopped.step} (epoch {self.stopped.epoch})"
            if self.stopped is not None
            else None
        )
        if self.cfg.module.output_network == "best" and self.best_weights is not None:
            return self.best_weights, Kept(
                "best",
                self.best.step,
                self.best.epoch,
                stopped,
            )
        return last, Kept("last", step, stopped_early=stopped)


def _plain(value: Any) -> Optional[dict[str, Any]]:
    return None if value is None else asdict(value)


def _typed(cls: type, value: Optional[dict[str, Any]]) -> Any:
    return None if value is None else cls(**value)
