"""A search trial as the job that trains it sees it. The sweeper (seqlab.search) asks the study for
the trial and tells it the result; the job, which may run in another process (hydra/launcher=joblib)
or on another machine, reaches the same trial through the study's storage, named in its
environment (hydra.job.env_set), to report each epoch's val_rmse and to ask the pruner whether
to go on. Imported by the task, not at CLI start-up."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

log = logging.getLogger("seqlab")

ENV_STORAGE = "SEQLAB_OPTUNA_STORAGE"
ENV_STUDY = "SEQLAB_OPTUNA_STUDY"
ENV_TRIAL = "SEQLAB_OPTUNA_TRIAL"  # the trial's number in its study
PRUNED_AT = "pruned_at_epoch"

@dataclass
class TrialLink:
    storage: str
    study: str
    number: int

    def tags(self) -> dict[str, str]:
        return {"optuna_study": self.study, "optuna_trial": str(self.number), "trial_state": "RUNNING"}

def current() -> Optional[TrialLink]:
    """The trial this process trains, if it is a search's job."""
    number = os.environ.get(ENV_TRIAL)
    if not number:
        return None
    return TrialLink(os.environ[ENV_STORAGE], os.environ[ENV_STUDY], int(number))

def trial_tags() -> dict[str, str]:
    link = current()
    return link.tags() if link else {}

def trial_callbacks(tracker: Any, result: Any) -> list:
    """What a search's job adds to training: the per-epoch report and the pruning decision."""
    link = current()
    return [TrialReporter(link, tracker, result)] if link else []

class TrialReporter(pl.Callback):
    """Reports val_rmse once an epoch (the last validation of the epoch) under the epoch's number,
    so that trials with different batch sizes are compared at the same point, and stops training
    at that epoch's end when the pruner says so: the run then ends as any run does (final metrics,
    checkpoint), tagged trial_state=PRUNED with pruned_at_epoch."""

    def __init__(self, link: TrialLink, tracker: Any, result: Any) -> None:
        self.link = link
        self.tracker = tracker
        self.result = result
        self.trial = None
        self.latest: Optional[float] = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:  # one process speaks for a DDP job
            self.trial = open_trial(self.link)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get("val_rmse")
        if value is not None:
            self.latest = float(value)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook.
        epoch = trainer.current_epoch + 1
        value, prune = self.latest, False
        if self.trial is not None and value is not None:
            self.trial.report(value, epoch)
            prune = self.trial.should_prune()
        self.latest = None
        if not trainer.strategy.broadcast(prune, src=0):  # every DDP process stops at the same epoch
            return
        trainer.should_stop = True
        if self.trial is None:
            return
        n = self.link.number
        self.trial.set_user_attr(PRUNED_AT, epoch)
        self.tracker.log_metrics({PRUNED_AT: float(epoch)}, trainer.global_step)
        self.tracker.set_tags({"trial_state": "PRUNED", PRUNED_AT: epoch})
        self.result.reason = f"trial {n} pruned at epoch {epoch} (val_rmse {value:.4g}): worse than the trials before it"
        log.info("pruned    trial %d at epoch %d of %d: val_rmse %.4g is worse than the trials before it at that epoch",
                 n, epoch, trainer.max_epochs, value)


def open_trial(link: TrialLink):
    """The trial, bound to its study with the study's pruner (which the storage does not keep:
    the sweeper stores its settings with the study)."""
    import optuna

    from seqlab.search import make_pruner, storage_for

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(link.storage)
    probe = optuna.load_study(study_name=link.study, storage=storage)
    study = optuna.load_study(study_name=link.study, storage=storage,
                              pruner=make_pruner(probe.user_attrs.get("seqlab_pruner") or {"name": "none"}))
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, link.number)
    return optuna.trial.Trial(study, trial_id)
