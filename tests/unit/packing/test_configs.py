"""A member's config composed once per choice of config groups is what Hydra's compose makes."""

from __future__ import annotations

import pytest
from conftest import CONF_DIR
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from seqlab.hydra_version import VERSION_BASE
from seqlab.packing.configs import GroupCompositions

CASES = [
    # a study's replicas: groups (sweep, perf) and values, the values differing member to member
    ["sweep=device_batch", "seed=5", "data.batch_size=1024", "perf=fast", "replicas=32"],
    ["sweep=device_batch", "seed=6", "data.batch_size=1024", "perf=fast", "replicas=32"],
    # a value given before the group that holds it, an added and a deleted key
    ["optimizer.lr=0.01", "optimizer=sgdm", "+optimizer.nesterov=true", "~scheduler"],
    ["experiment=matlab_seed", "seed=3", "model.dropout=0.25"],
    ["seed=1"],
]


def test_a_member_composed_from_its_groups_composition_is_hydras_own():
    mine = GroupCompositions()
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        for overrides in CASES + CASES:  # the second time from the kept compositions
            theirs = compose("train", overrides=overrides)
            ours = mine.compose("train", overrides)
            assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs), overrides
            assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(theirs)
        # one composition per choice of groups; the members' values change their copies alone
        assert len(mine._kept) == 4
        first = mine.compose("train", CASES[0])
        first.seed = 99
        assert mine.compose("train", CASES[1]).seed == 6


def test_a_bad_value_fails_as_in_hydras_compose():
    mine = GroupCompositions()
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        for bad in (["perf=fast", "no_such_key=1"], ["perf=fast", "seed=abc"]):
            with pytest.raises(ConfigCompositionException) as theirs:
                compose("train", overrides=bad)
            with pytest.raises(ConfigCompositionException) as ours:
                mine.compose("train", bad)
            assert str(ours.value) == str(theirs.value)
