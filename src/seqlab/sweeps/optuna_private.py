"""Every use of Optuna's private API, in one place. Each is something the public API does not offer:
setting a user attribute on a trial this process did not ask for (a RUNNING trial left by a search
that was killed outright: only the `Trial` that `study.ask()` returned has a public setter),
whether a value lies inside a distribution (the starting config's value, before it is enqueued),
and, for many workers on one study, the storage's heartbeat, a trial's storage id and putting a
trial back to WAITING.
An Optuna upgrade can break them, so each call checks first that the installed Optuna is one
these were tested with, and says so in one line if not."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import optuna

from seqlab import require_tested

if TYPE_CHECKING:
    import optuna

# The Optuna releases these uses were read against and tested with (pyproject.toml holds optuna
# below the next major one).
TESTED = ("5.",)


@functools.cache
def check_version() -> None:

    require_tested("optuna", optuna.__version__, TESTED, "Optuna")


def set_trial_user_attr(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, key: str, value: Any
) -> None:
    """A user attribute on a trial read back from the study (a FrozenTrial), through its storage id."""
    check_version()
    study._storage.set_trial_user_attr(trial._trial_id, key, value)


def storage_of(study: optuna.Study) -> Any:
    """The study's storage object (its heartbeat: record_heartbeat, heartbeat_interval)."""
    check_version()
    return study._storage


def trial_id(trial: optuna.trial.Trial) -> int:
    check_version()
    return trial._trial_id


def set_trial_waiting(study: optuna.Study, trial: optuna.trial.Trial) -> None:
    """A RUNNING trial back to WAITING, its values kept: the next `ask` of any worker takes it."""

    check_version()
    study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.WAITING)


def contains(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    """Whether `value` (as a config holds it) is a value the distribution can give: inside the
    range and on its step, or one of the choices."""
    check_version()
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except (ValueError, TypeError):
        return False


def trial_by_number(study: optuna.Study, number: int) -> optuna.trial.Trial:
    """The study's trial `number` as a `Trial` to tell and tag (one a pack job asked for itself,
    seqlab.sweeps.refill)."""
    check_version()
    storage = study._storage
    return optuna.trial.Trial(
        study, storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    )
