"""Many search workers on one study: the same hparams_search command run twice at once shares the
study without failing the other's trials and stops at n_trials; a worker that died is found by
Optuna's trial heartbeat and its values run again, while another host's live trial is left alone."""

from __future__ import annotations

import optuna


def test_a_retry_two_workers_enqueued_at_once_runs_once(tmp_path):
    """Issue 34, point 1: two workers preparing at once both enqueue the retry of an interrupted trial;
    whoever asks them, only the lowest-numbered runs, the other ends holding no slot."""
    from seqlab.sweeps import workers
    from seqlab.sweeps.study import INTERRUPTED, RETRY_OF

    study = optuna.create_study(study_name="twice", storage=f"sqlite:///{tmp_path}/optuna.db")
    first = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    first.set_user_attr(INTERRUPTED, True)
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    for _ in range(2):  # each worker saw it not retried yet, and enqueued it
        study.enqueue_trial(first.params, user_attrs={RETRY_OF: first.number})
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}
    b_asked = [
        study.ask(space)
    ]  # worker B asks first: it takes the lowest-numbered retry, and runs it
    a_asked = [study.ask(space)]
    assert workers.settle(study, b_asked, n_trials=3) == b_asked
    assert workers.settle(study, a_asked, n_trials=3) == []  # the second retry of trial 0: dropped
    trials = study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "FAIL"]
    assert (
        workers.free_slots(study, 3) == 2
    )  # trial 0 is retried, its duplicate holds no slot: only b's


def test_a_trial_is_gone_only_when_its_search_process_and_its_trainer_both_are(tmp_path):
    """A trainer that has ended (a SLURM job on this node, done) leaves its trial to the live search
    process that will tell the study its result: another worker preparing meanwhile must not fail it."""
    from seqlab.store.ghosts import identity
    from seqlab.sweeps import workers

    study = optuna.create_study(study_name="gone", storage=f"sqlite:///{tmp_path}/optuna.db")
    alive, dead = identity(), {**identity(), "process_pid": "999999"}
    cases = [
        (alive, None, False),
        (dead, None, True),
        (alive, dead, False),
        (dead, alive, False),
        (dead, dead, True),
    ]
    for worker, trainer, gone in cases:
        trial = study.ask()
        trial.set_user_attr(workers.WORKER, worker)
        if trainer is not None:
            trial.set_user_attr(workers.TRAINER, trainer)
        assert workers.worker_gone(study.trials[trial.number]) is gone, (
            worker["process_pid"],
            trainer,
        )


def test_a_trial_just_asked_whose_worker_has_not_named_itself_yet_is_not_gone(tmp_path):
    """Between a worker's study.ask() and its naming itself on the trial (workers.taken), another
    worker preparing at that moment saw a RUNNING trial with no worker and failed it as gone (seen in
    CI: two workers started together, Trial#0 "has already finished" in the one that asked it). Only a
    trial that has gone unnamed past a while is one from before workers said who they are."""
    import datetime

    from seqlab.sweeps import workers

    study = optuna.create_study(study_name="fresh", storage=f"sqlite:///{tmp_path}/optuna.db")
    study.ask()
    (fresh,) = study.get_trials(deepcopy=False)
    assert not workers.worker_gone(fresh)
    old = fresh.datetime_start - datetime.timedelta(seconds=workers.UNNAMED_S + 1)
    legacy = optuna.trial.FrozenTrial(
        number=1,
        state=optuna.trial.TrialState.RUNNING,
        value=None,
        datetime_start=old,
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=2,
    )
    assert workers.worker_gone(legacy)
