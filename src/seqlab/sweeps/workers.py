"""Many search processes on one study (Optuna's way to add workers, and the only way to search
across a cluster): the same `hparams_search=optuna` command started N times, on one machine or as
SLURM array tasks, against one study database.

- Nobody fails another worker's live trial. Each worker renews Optuna's trial heartbeat for the
  trials it runs (`Heartbeats`); a worker that died is found by Optuna's own check
  (`fail_stale_trials`: no heartbeat for `grace_period` seconds, by the database's clock), and the
  failed-trial callback (`retry_stale`) enqueues the same values again, which the next free worker
  runs.
- The total stays n_trials. A worker asks only for slots no trial holds (`free_slots`); two that
  ask for the last slot at the same moment both get a trial, and the one with the higher number
  gives it back (`surplus`): it waits in the study, unasked, with its values, for a later run that
  raises n_trials.
- A trial's heartbeat comes from the process that trains it too (`trainer_heartbeat`: a job, or a
  pack's process for its members), which also names itself the trial's trainer: a sweeper lost to
  an SSH hang-up leaves its jobs' trials alive while they train, and a trial is failed only when
  nothing runs it (no beat from it, or its search process and trainer both gone on this machine).
- A retry runs once: two workers that enqueue the same retry at once (both preparing) each keep
  only the lowest-numbered trial retrying a number (`duplicates`); the others end, holding no slot.
- The report is written by the worker that finishes last: the others see trials still running
  elsewhere and leave it to that one; if that one dies, the next command on the study writes it.

Heartbeats need a database storage (SQLite, PostgreSQL, ...): Optuna 5's journal file storage has
none, so there a worker killed outright leaves its trial RUNNING (see docs/scaling.md)."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Iterable, Optional

import optuna

from seqlab.store.ghosts import identity, why_dead
from seqlab.sweeps import optuna_private
from seqlab.sweeps.study import INTERRUPTED, RETRY_OF, STARTING

SURPLUS = "seqlab_surplus"  # a trial given back: it holds no slot until a worker asks it again
DUPLICATE = (
    "seqlab_duplicate"  # a second retry of one trial, enqueued by two workers at once: never run
)
HEARTBEAT = (
    "seqlab_heartbeat_s"  # the study's heartbeat interval, for the processes that train its trials
)
WORKER = "seqlab_worker"  # the search process that asked for the trial (host, pid, ...: seqlab.store.ghosts.identity)
UNNAMED_S = 60  # a trial asked this recently may not name its worker yet (ask() -> taken())
TRAINER = (
    "seqlab_trainer"  # the process that trains it (a job, or a pack's process), once it has started
)


def retried(trials: Iterable[optuna.trial.FrozenTrial]) -> set[int]:
    """The trial numbers that another trial runs again (its RETRY_OF)."""
    return {t.user_attrs[RETRY_OF] for t in trials if RETRY_OF in t.user_attrs}


def holds_slot(trial: optuna.trial.FrozenTrial, again: set[int]) -> bool:
    """Whether a trial counts toward n_trials: finished, running or waiting to run, but not one that
    was interrupted or whose worker died (its values run again in another trial), nor one given back."""
    states = optuna.trial.TrialState
    if trial.state == states.FAIL:
        return (
            not trial.user_attrs.get(INTERRUPTED)
            and not trial.user_attrs.get(DUPLICATE)
            and trial.number not in again
        )
    if trial.state == states.WAITING:
        return not trial.user_attrs.get(SURPLUS)
    return True


def free_slots(study: optuna.Study, n_trials: int) -> int:
    """How many trials a worker may ask for now: n_trials less those that ended or run (waiting
    ones are not deducted: an ask takes them first)."""
    trials = study.get_trials(deepcopy=False)
    again = retried(trials)
    return n_trials - sum(
        holds_slot(t, again) and t.state != optuna.trial.TrialState.WAITING for t in trials
    )


def surplus(
    study: optuna.Study, mine: list[optuna.trial.Trial], n_trials: int
) -> list[optuna.trial.Trial]:
    """Which of the trials this worker has just asked for lie past n_trials, counting every trial
    that holds a slot in the order of their numbers (unique and increasing: the lowest keep theirs)."""
    trials = study.get_trials(deepcopy=False)
    again = retried(trials)
    keep = {
        t.number
        for t in sorted((t for t in trials if holds_slot(t, again)), key=lambda t: t.number)[
            :n_trials
        ]
    }
    return [t for t in mine if t.number not in keep]


def duplicates(study: optuna.Study, mine: list[optuna.trial.Trial]) -> list[optuna.trial.Trial]:
    """Which of the trials this worker has just asked for retry a number that a lower-numbered trial
    retries already (two workers enqueued one retry at once): the lowest keeps it, whoever asks it."""
    first: dict[int, int] = {}
    for t in study.get_trials(deepcopy=False):
        n = t.user_attrs.get(RETRY_OF)
        if n is not None and not t.user_attrs.get(DUPLICATE):
            first[n] = min(first.get(n, t.number), t.number)
    return [
        t
        for t in mine
        if RETRY_OF in t.user_attrs and first.get(t.user_attrs[RETRY_OF], t.number) < t.number
    ]


def drop_duplicate(study: optuna.Study, trial: optuna.trial.Trial) -> None:
    trial.set_user_attr(DUPLICATE, True)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def settle(
    study: optuna.Study, trials: list[optuna.trial.Trial], n_trials: int
) -> list[optuna.trial.Trial]:
    """Of the trials this worker has just asked for, those it runs: a duplicate retry is dropped, and
    one past n_trials (another worker took the last slot meanwhile) given back."""
    for t in duplicates(study, trials):
        drop_duplicate(study, t)
        trials.remove(t)
        print(
            f"trial {t.number:<3} dropped: it retries trial {t.user_attrs[RETRY_OF]}, which another worker "
            "retries already",
            flush=True,
        )
    for t in surplus(study, trials, n_trials):
        give_back(study, t)
        trials.remove(t)
        print(
            f"trial {t.number:<3} given back: another worker took the last slot (it waits, with its values, "
            "for a run with a higher n_trials)",
            flush=True,
        )
    return trials


def give_back(study: optuna.Study, trial: optuna.trial.Trial) -> None:
    trial.set_user_attr(SURPLUS, True)
    optuna_private.set_trial_waiting(study, trial)


def taken(trial: optuna.trial.Trial) -> None:
    """A trial this worker has just asked for: which process runs it (a worker on the same machine
    killed outright is found gone at once, without waiting for the grace period), and one given
    back earlier holds a slot again."""
    trial.set_user_attr(WORKER, identity())
    if trial.user_attrs.get(SURPLUS):
        trial.set_user_attr(SURPLUS, False)


def worker_gone(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether nothing runs a RUNNING trial any more: its search process and, once one started, its
    trainer both provably gone (processes of this machine that no longer run; another host's are
    told by their heartbeat, fail_stale_trials). A trainer that has ended leaves its trial to the
    live search process, which tells the study its result. A trial with no worker named is one
    whose worker has just asked for it (it names itself next: `taken`), unless it has gone unnamed
    for UNNAMED_S: then it is from before workers said who they are, and counts as gone, as searches
    did then."""
    worker = trial.user_attrs.get(WORKER)
    if not isinstance(worker, dict):
        started = trial.datetime_start
        return started is None or (datetime.datetime.now() - started).total_seconds() > UNNAMED_S
    processes = [worker, trial.user_attrs.get(TRAINER)]
    return all(why_dead(p, time.time()) is not None for p in processes if isinstance(p, dict))


def retry_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Optuna's failed-trial callback for a trial whose worker stopped beating: the same values again."""
    if trial.params:
        study.enqueue_trial(
            trial.params,
            user_attrs={RETRY_OF: trial.number, STARTING: trial.user_attrs.get(STARTING, False)},
        )
    print(
        f"trial {trial.number:<3} its worker stopped (no heartbeat): FAIL, and its values run again",
        flush=True,
    )


def retry_interrupted(study: optuna.Study, keys: set[str]) -> None:
    """Before a worker asks for trials: those whose worker stopped beating (Optuna's fail_stale_trials,
    then retry_stale), or died on this machine (kill -9: nothing trains them now), or that a stop
    interrupted, are ended and their values enqueued again (a retry two workers enqueue at once runs
    once: `settle`). Other workers' live trials are left alone."""
    states = optuna.trial.TrialState
    optuna.storages.fail_stale_trials(study)
    for t in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
        if worker_gone(t):
            try:
                optuna_private.set_trial_user_attr(study, t, INTERRUPTED, True)
                study.tell(t.number, state=states.FAIL)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
                pass  # another worker preparing at the same moment ended it first
    trials = study.get_trials(deepcopy=False)
    again = retried(trials)
    for t in trials:
        if (
            t.state == states.FAIL
            and t.user_attrs.get(INTERRUPTED)
            and t.number not in again
            and set(t.params) == keys
        ):
            study.enqueue_trial(
                t.params,
                user_attrs={RETRY_OF: t.number, STARTING: t.user_attrs.get(STARTING, False)},
            )


def running_elsewhere(study: optuna.Study) -> list[int]:
    """The trials still running once this worker's own have ended: other workers'."""
    return [
        t.number
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    ]


class Heartbeats:
    """Renews Optuna's heartbeat of the trials this worker runs, from a daemon thread (the launcher
    holds the main thread while jobs train). Nothing where the storage has no heartbeat."""

    def __init__(self, storage: Any, every_s: Optional[float] = None) -> None:
        self.storage = storage
        self.every_s: Optional[float] = every_s or getattr(storage, "heartbeat_interval", None)
        self.trial_ids: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def watch(self, trials: list[optuna.trial.Trial]) -> None:
        with self._lock:
            self.trial_ids = [optuna_private.trial_id(t) for t in trials]
        self._beat()  # at once: a trial without a heartbeat record is never found stale
        if self.every_s and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="seqlab-trial-heartbeat", daemon=True
            )
            self._thread.start()

    def _beat(self) -> None:
        if not self.every_s:
            return
        with self._lock:
            ids = list(self.trial_ids)
        for trial_id in ids:
            try:
                self.storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a busy database: the next beat tries again
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()

    def stop(self) -> None:
        self._stop.set()


def trainer_heartbeat(trials: list[optuna.trial.Trial]) -> Heartbeats:
    """The training process's heartbeat of the trials it trains (a job's, a pack's members'), at
    the interval the search gave the study, from the moment they open until `stop()`; the trials
    name this process their trainer. Where the study keeps no heartbeat, nothing beats."""
    for t in trials:
        t.set_user_attr(TRAINER, identity())
    every_s = trials[0].study.user_attrs.get(HEARTBEAT) if trials else None
    beats = Heartbeats(
        optuna_private.storage_of(trials[0].study) if trials else None, every_s=every_s
    )
    if every_s:
        beats.watch(trials)
    return beats
