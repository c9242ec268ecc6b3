"""seqlab.sweeps.refill: what a search tells of the trials its pack jobs took into freed slots
(hydra.sweeper.refill)."""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf

from seqlab.sweeps.refill import RefillLog, check_refill, refilled_overrides, refilled_under
from seqlab.sweeps.search_outcomes import tell_interrupted
from seqlab.sweeps.study import INTERRUPTED, SearchError

LR = {"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}


def test_a_stopped_search_fails_the_trials_its_pack_jobs_took_and_keeps_those_told(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db")
    space = {"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    trials = [study.ask(space) for _ in range(4)]
    study.tell(trials[2].number, 0.5)  # its pack job told it as its run ended
    # Two pack jobs of the sweep wrote what they took: job 0 trials 2 and 3, job 1 trial 1.
    for job, taken in (("0", [(2, 3), (3, 4)]), ("1", [(1, 2)])):
        (tmp_path / job).mkdir()
        log = RefillLog()
        for trial, member in taken:
            log.add(tmp_path / job, trial, member)

    taken = refilled_under(tmp_path, study)
    assert [t.number for t in taken] == [2, 3, 1]
    tell_interrupted(study, taken, None)
    states = {t.number: (t.state.name, t.user_attrs.get(INTERRUPTED)) for t in study.trials}
    assert states == {
        0: ("RUNNING", None),  # the sweeper's own in-flight trial: not in any refills.json
        1: ("FAIL", True),
        2: ("COMPLETE", None),
        3: ("FAIL", True),
    }


def test_a_trial_in_a_slot_takes_the_members_overrides_with_its_own_values_and_name(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db")
    for _ in range(7):  # trials 0-6 asked before: this one is number 7
        study.ask()
    study.enqueue_trial({"optimizer.lr": 0.003, "model.dropout": 0.2})
    trial = study.ask(
        {
            "optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
            "model.dropout": optuna.distributions.FloatDistribution(0.0, 0.5),
        }
    )
    old = [
        "data.n_samples=512",
        "optimizer.lr=0.01",
        "model.dropout=0.1",
        "logger.run_name=trial-3",
        "++hydra.job.env_set.SEQLAB_OPTUNA_TRIAL=3",
    ]
    new = refilled_overrides(old, trial)
    assert new[0] == "data.n_samples=512" and len(new) == 5
    assert {o.partition("=")[0] for o in new[1:3]} == {"optimizer.lr", "model.dropout"}
    assert OmegaConf.from_dotlist([o for o in new[1:3]]) == {
        "optimizer": {"lr": 0.003},
        "model": {"dropout": 0.2},
    }
    assert new[3:] == ["logger.run_name=trial-7", "++hydra.job.env_set.SEQLAB_OPTUNA_TRIAL=7"]


@pytest.mark.parametrize(
    "overrides,pack,space,expected",
    [
        (
            [],
            None,
            LR,
            "hydra.sweeper.refill=true gives a pack's freed slots to the next trials: add pack=N (N >= 2)",
        ),
        (
            [],
            4,
            {**LR, "seed": optuna.distributions.IntDistribution(0, 9)},
            "hydra.sweeper.refill=true: trials take each other's slots, so they may differ only in "
            "optimizer.lr, module.l2_regularization, model.dropout, module.gradient_threshold; seed is "
            "searched (leave it out with hydra.sweeper.params.seed=null, or refill=false)",
        ),
        (
            ["scheduler=piecewise"],
            4,
            LR,
            "hydra.sweeper.refill=true: a learning-rate schedule steps every member by the pack's "
            "epochs: scheduler=none",
        ),
        (
            ["trainer.check_val_every_n_epoch=2"],
            4,
            LR,
            "hydra.sweeper.refill=true: pruning and the trials' records need one validation an epoch: "
            "trainer.check_val_every_n_epoch=1 trainer.val_check_interval=null",
        ),
        (
            ["trainer.devices=2", "trainer.strategy=ddp"],
            4,
            LR,
            "hydra.sweeper.refill=true: a pack across processes keeps its slots: one device",
        ),
    ],
    ids=["no-pack", "the-seed-searched", "a-schedule", "validation-every-2-epochs", "ddp"],
)
def test_a_search_that_cannot_refill_is_told_why_in_one_line(
    compose_cfg, overrides, pack, space, expected
):
    cfg = compose_cfg("scheduler=none", *overrides)
    with pytest.raises(SearchError) as refused:
        check_refill(True, pack, space, cfg)
    assert str(refused.value) == expected
    check_refill(True, 4, LR, compose_cfg("scheduler=none"))  # what can refill passes
