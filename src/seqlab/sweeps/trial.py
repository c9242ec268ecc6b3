"""A search trial as the job that trains it sees it. The sweeper (seqlab.sweeps.search) asks the study for
the trial and tells it the result; the job, which may run in another process (hydra/launcher=joblib)
or on another machine, reaches the same trial through the study's storage, named in its
environment (hydra.job.env_set), to report each epoch's val_rmse and to ask the pruner whether
to go on. Light to import: every job of a multirun asks whether it is a trial."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

ENV_STORAGE = "SEQLAB_OPTUNA_STORAGE"
ENV_STUDY = "SEQLAB_OPTUNA_STUDY"
ENV_TRIAL = "SEQLAB_OPTUNA_TRIAL"  # the trial's number in its study
ENV_REFILL = "SEQLAB_OPTUNA_REFILL"  # a refilling search's n_trials, space and sampler (JSON)
PRUNED_AT = "pruned_at_epoch"


@dataclass
class TrialLink:
    storage: str
    study: str
    number: int

    def tags(self) -> dict[str, str]:
        return {
            "optuna_study": self.study,
            "optuna_trial": str(self.number),
            "trial_state": "RUNNING",
        }


def current() -> Optional[TrialLink]:
    """The trial this process trains, if it is a search's job."""
    number = os.environ.get(ENV_TRIAL)
    if not number:
        return None
    return TrialLink(os.environ[ENV_STORAGE], os.environ[ENV_STUDY], int(number))


def set_environment(values: dict[str, str]) -> Callable[[], None]:
    """`values` in this process's environment; returns what puts the environment back as it was."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)

    def restore() -> None:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


def study_environment(storage: str, study: str, refill: Optional[str] = None) -> Callable[[], None]:
    """The study in this process's environment, where its jobs (and a pack's members) find it, with
    what a pack job needs to refill its freed slots (seqlab.sweeps.refill.refill_settings); returns
    what puts the environment back as it was."""
    values = {ENV_STORAGE: storage, ENV_STUDY: study}
    if refill is not None:
        values[ENV_REFILL] = refill
    return set_environment(values)


def member_link(overrides: list[str]) -> Optional[TrialLink]:
    """The trial of a pack's member (seqlab.packing): its number is in its own overrides (the
    sweeper's `hydra.job.env_set` for a job alone, which a pack of trials cannot set per member),
    the study's storage and name in the pack job's environment, which all its members share."""
    number = next(
        (
            o.partition("=")[2]
            for o in overrides
            if o.lstrip("+").partition("=")[0] == f"hydra.job.env_set.{ENV_TRIAL}"
        ),
        None,
    )
    if number is None or ENV_STUDY not in os.environ or ENV_STORAGE not in os.environ:
        return None
    return TrialLink(os.environ[ENV_STORAGE], os.environ[ENV_STUDY], int(number.strip("'")))


@contextmanager
def as_current(link: Optional[TrialLink]) -> Iterator[None]:
    """`link` as this process's trial while a pack's member trains on its own (a pack that cannot
    train packed runs its members one by one, each as its job alone)."""
    restore = set_environment({ENV_TRIAL: str(link.number)}) if link is not None else None
    try:
        yield
    finally:
        if restore is not None:
            restore()


def trial_tags() -> dict[str, str]:
    link = current()
    return link.tags() if link else {}


def open_trial(link: TrialLink):
    """The trial, bound to its study with the study's pruner (which the storage does not keep:
    the sweeper stores its settings with the study)."""
    import optuna  # Optuna: a trial's job only (every job imports this module)

    from seqlab.sweeps.study import (  # Optuna: a trial's job only (every job imports this module)
        make_pruner,
        storage_for,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(link.storage)
    study_id = storage.get_study_id_from_name(link.study)
    pruner = make_pruner(
        storage.get_study_user_attrs(study_id).get("seqlab_pruner") or {"name": "none"}
    )
    study = optuna.load_study(study_name=link.study, storage=storage, pruner=pruner)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, link.number)
    return optuna.trial.Trial(study, trial_id)
