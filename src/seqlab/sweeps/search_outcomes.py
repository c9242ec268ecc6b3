"""How a search's trials ended, told to the study: each launched trial from its MLflow run (or its
job's result file, seqlab.sweeps.search_runs) as COMPLETE, PRUNED or FAIL; the trials a stop
interrupted failed and marked to run again. The search that launches them: seqlab.sweeps.search."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import optuna

from seqlab import one_line
from seqlab.sweeps.search_runs import Tracking, job_result
from seqlab.sweeps.study import INTERRUPTED
from seqlab.sweeps.trial import PRUNED_AT


@dataclass
class Outcome:
    number: int
    state: str  # COMPLETE | PRUNED | FAIL
    value: Optional[float]
    run_id: Optional[str]
    run_name: Optional[str]
    note: str = ""


def tell(
    study: optuna.Study,
    trial: optuna.trial.Trial,
    ret: Any,
    tracking: Optional["Tracking"],
    objective: str,
    member: Optional[int] = None,
) -> Outcome:
    """Tell the study how the trial ended, from its MLflow run (or its job's result file);
    `objective`: the search's, the run's metric a COMPLETE trial's value is;
    `member`: its place in the pack job `ret` (None: a job of its own). A trial its pack job told
    already as its run ended (hydra.sweeper.refill: tell_ended) is reported as told."""
    result = job_result(ret, member)
    run = tracking.run_of(study.study_name, trial.number) if tracking else None
    run_id = run.info.run_id if run else (result.run_id if result else None)
    run_name = run.info.run_name if run else (result.run_name if result else None)
    frozen = _trial_of(study, trial.number)  # as the job left it (its pruned_at_epoch)
    status = run.info.status if run else (result.status if result else "FAILED")
    if frozen.state.is_finished():
        state, value = frozen.state, frozen.value
        note = f"the run recorded no finite {objective}" if state.name == "FAIL" else ""
    else:
        value = (
            run.data.metrics.get(objective)
            if run
            else (result.val_rmse if result and objective == "final_val_rmse" else None)
        )
        state, value, note = _judged(status, PRUNED_AT in frozen.user_attrs, value, objective)
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        study.tell(trial.number, value, state=state)
    if state == optuna.trial.TrialState.FAIL and status != "FINISHED":
        note = result.reason if result and result.reason else f"run {status}"
    elif state == optuna.trial.TrialState.PRUNED:
        note = f"pruned at epoch {frozen.user_attrs[PRUNED_AT]}"
    if state == optuna.trial.TrialState.PRUNED:
        value = _trial_of(study, trial.number).value  # Optuna's: the last value the job reported
    if tracking and run_id:
        tracking.tag(run_id, {"trial_state": state.name})
    return Outcome(trial.number, state.name, value, run_id, run_name, note)


def tell_ended(trial: optuna.trial.Trial, result: Any) -> str:
    """Tell the study how a trial ended, from the job that trained it, as its run ends (a pack
    that refills its freed slots: seqlab.packing.refill), so that the pruner and the sampler count
    it at once, not when the pack's job returns. `result`: its JobResult. Returns the state told."""
    objective = trial.study.user_attrs.get("seqlab_objective", "best_val_rmse")
    value = result.best_val_rmse if objective == "best_val_rmse" else result.val_rmse
    state, value, _ = _judged(result.status, PRUNED_AT in trial.user_attrs, value, objective)
    if result.run_id:
        trial.set_user_attr("mlflow_run_id", result.run_id)
    trial.study.tell(trial.number, value, state=state)
    return state.name


def _judged(
    status: str, pruned: bool, value: Optional[float], objective: str
) -> tuple[optuna.trial.TrialState, Optional[float], str]:
    """A trial's state, value (a COMPLETE one's only) and note, from its run's status, whether its
    pruner stopped it, and its objective."""
    states = optuna.trial.TrialState
    if status != "FINISHED":
        return states.FAIL, None, f"run {status}"
    if pruned:
        return states.PRUNED, None, ""
    if value is None or not math.isfinite(value):
        return states.FAIL, None, f"the run recorded no finite {objective}"
    return states.COMPLETE, value, ""


def tell_interrupted(
    study: optuna.Study, in_flight: Sequence[optuna.trial.Trial], tracking: Optional["Tracking"]
) -> None:
    """The trials that were training when the search stopped (`in_flight`) are not counted as finished:
    they fail, marked for a run again with the same values when the command is repeated, and
    their MLflow runs end KILLED (a job stopped in this process ended its own already)."""
    states = optuna.trial.TrialState
    for trial in in_flight:
        try:
            if _trial_of(study, trial.number).state.is_finished():
                continue
            trial.set_user_attr(INTERRUPTED, True)
            study.tell(trial.number, state=states.FAIL)
            if tracking:
                tracking.kill(study.study_name, trial.number)
            print(
                f"trial {trial.number:<3} INTERRUPTED: not counted; the same command runs it again",
                flush=True,
            )
        except Exception as error:  # noqa: BLE001 - the stop goes on
            print(
                f"trial {trial.number:<3} could not be marked interrupted: {one_line(error)}",
                flush=True,
            )


def _trial_of(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """The trial as the study's storage holds it now (get_trials reads unfinished trials afresh:
    a job in another process reports to them)."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)
