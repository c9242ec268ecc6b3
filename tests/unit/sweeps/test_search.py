"""hparams_search=optuna through the real CLI: every trial a child run of the sweep's parent, the
best config and Optuna's plots on the parent, pruning, a stopped search continued by the same
command, and bad search-space entries refused in one line before anything trains."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution


def test_hydra_finds_the_sweeper_plugin():
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    assert "SeqlabOptunaSweeper" in [p.__name__ for p in Plugins.instance().discover(Sweeper)]
    assert "seqlab_optuna.yaml" in ConfigStore.instance().list("hydra/sweeper")


def test_the_search_space_accepts_nested_and_dotted_keys_and_lists():
    from seqlab.sweeps.space import flatten_space, parse_space
    from seqlab.sweeps.study import overrides_for

    space = parse_space(
        flatten_space(
            {
                "optimizer": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
                "model.hidden_size": {"type": "int", "low": 8, "high": 64, "step": 8},
                "data": {"batch_size": [32, 64]},
                "model": {"dropout": None},  # left out
            }
        )
    )
    assert sorted(space) == ["data.batch_size", "model.hidden_size", "optimizer.lr"]
    assert space["optimizer.lr"].log and space["model.hidden_size"].step == 8
    assert overrides_for(
        {"optimizer.lr": 1e-05, "optimizer": "adam", "notes": "a b", "x": None}
    ) == ["optimizer.lr=1e-05", "optimizer=adam", "notes='a b'", "x=null"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"type": "float", "low": 1.0, "high": 1.0}, "empty range: low=1.0 must be below high=1.0"),
        (
            {"type": "float", "low": -1.0, "high": 1.0, "log": True},
            "a log range must stay above 0, got low=-1.0",
        ),
        ({"type": "lognormal", "low": 1, "high": 2}, "unknown distribution 'lognormal'"),
        ({"type": "categorical", "choices": []}, "categorical needs a non-empty list of choices"),
        ({"type": "int", "low": 1, "high": 8, "lo": 2}, "int takes high, log, low, step; not lo"),
        (
            {"type": "float", "low": 0.1, "high": 1.0, "log": True, "step": 0.1},
            "log: true and step cannot be combined",
        ),
        (42, "give {type: float|int|categorical, ...}, a list of choices or Hydra's sweep grammar"),
        ("interval(0.5, 0.5)", "empty range: low=0.5 must be below high=0.5"),
        ("tag(log, interval(0, 1))", "a log range must stay above 0, got low=0.0"),
        ("choice()", "not Hydra's sweep grammar"),
        ("interval(1e-4,", "not Hydra's sweep grammar"),
        ("glob(*)", "a sweep Optuna cannot sample"),
    ],
)
def test_each_kind_of_bad_entry_is_named(spec, message):
    from seqlab.sweeps.space import parse_space
    from seqlab.sweeps.study import SearchError

    with pytest.raises(SearchError, match="^hydra.sweeper.params.model.dropout: ") as error:
        parse_space({"model.dropout": spec})
    assert message in str(error.value)


# The official Optuna sweeper's cases (hydra-optuna-sweeper's tests: test_create_optuna_distribution_from_config
# and _from_override), their distributions in Optuna 5's names.
OFFICIAL_CASES = [
    ({"type": "categorical", "choices": [1, 2, 3]}, CategoricalDistribution([1, 2, 3])),
    ({"type": "int", "low": 0, "high": 10}, IntDistribution(0, 10)),
    ({"type": "int", "low": 0, "high": 10, "step": 2}, IntDistribution(0, 10, step=2)),
    ({"type": "int", "low": 0, "high": 5}, IntDistribution(0, 5)),
    ({"type": "int", "low": 1, "high": 100, "log": True}, IntDistribution(1, 100, log=True)),
    ({"type": "float", "low": 0, "high": 1}, FloatDistribution(0, 1)),
    ({"type": "float", "low": 0, "high": 10, "step": 2}, FloatDistribution(0, 10, step=2)),
    ({"type": "float", "low": 1, "high": 100, "log": True}, FloatDistribution(1, 100, log=True)),
    ("choice(1,2)", CategoricalDistribution([1, 2])),
    ("choice(true, false)", CategoricalDistribution([True, False])),
    ("choice('hello', 'world')", CategoricalDistribution(["hello", "world"])),
    ("shuffle(range(1,3))", CategoricalDistribution((1, 2))),
    ("range(1,3)", IntDistribution(1, 3)),
    ("interval(1, 5)", FloatDistribution(1, 5)),
    ("int(interval(1, 5))", IntDistribution(1, 5)),
    ("tag(log, interval(1, 5))", FloatDistribution(1, 5, log=True)),
    ("tag(log, int(interval(1, 5)))", IntDistribution(1, 5, log=True)),
    ("range(0.5, 5.5, step=1)", FloatDistribution(0.5, 5.5, step=1)),
    # and the forms the issue names
    ("tag(log, interval(1e-4, 1e-2))", FloatDistribution(1e-4, 1e-2, log=True)),
    ("range(8, 64, step=8)", IntDistribution(8, 64, step=8)),
    ("32,64,128", CategoricalDistribution([32, 64, 128])),  # a plain comma list: a choice
    ("0.25", CategoricalDistribution([0.25])),  # one value: every trial takes it
]


@pytest.mark.parametrize("entry, expected", OFFICIAL_CASES, ids=[str(e) for e, _ in OFFICIAL_CASES])
def test_sweep_grammar_and_mappings_give_the_official_sweepers_distributions(entry, expected):
    from seqlab.sweeps.space import parse_space

    (actual,) = parse_space({"key": entry}).values()
    if isinstance(expected, CategoricalDistribution):  # shuffle() orders its choices at random
        assert isinstance(actual, CategoricalDistribution) and set(actual.choices) == set(
            expected.choices
        )
        assert all(
            type(a) is type(b)
            for a, b in zip(sorted(actual.choices, key=str), sorted(expected.choices, key=str))
        )
    else:
        assert actual == expected


# A search that samples the distributions written in Hydra's sweep grammar on the command line:
# test_a_search_records_every_trial_under_the_parent_with_the_best_config_and_plots, above.


def test_the_command_lines_sweeps_join_the_space_and_the_rest_hold_for_every_trial():
    from seqlab.sweeps.space import split_arguments
    from seqlab.sweeps.study import SearchError

    fixed, swept = split_arguments(
        [
            "trainer.max_epochs=3",
            "optimizer.lr=tag(log, interval(1e-4, 1e-2))",
            "data.batch_size=choice(32,64)",
            "model.hidden_size=8,16",
            "optimizer=adam",
        ]
    )
    assert fixed == ["trainer.max_epochs=3", "optimizer=adam"]
    assert swept == {
        "optimizer.lr": "tag(log, interval(1e-4, 1e-2))",
        "data.batch_size": "choice(32,64)",
        "model.hidden_size": "8,16",
    }
    with pytest.raises(
        SearchError, match=r"^\+model.extra=1,2: a search samples keys the config has; drop the \+"
    ):
        split_arguments(["+model.extra=1,2"])
