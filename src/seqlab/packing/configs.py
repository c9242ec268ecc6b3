"""A pack's members' configs, each composed by Hydra from its job's overrides (issue 32, point 6),
at the cost of one composition per distinct choice of config groups (issue 35).

Values cannot change Hydra's defaults list (packing.hydra_private says how Hydra composes), so the
members of a pack, which differ in their values (the replicas' seeds, a search's rates) and rarely
in their groups, share the composition of their groups: it is done once a process per choice of
groups (about 0.09 s: YAML files read and parsed, the defaults tree, the merges) and each member
takes a copy and its own values through Hydra's own second step (a few ms). The device x batch
study's 600 members composed for 57 s before this."""

from __future__ import annotations

import copy
from collections import OrderedDict
from pathlib import Path

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from seqlab.packing.hydra_private import apply_values, split_overrides
from seqlab.sweeps.packs import key_of

# Choices of config groups kept a process (a study has a handful; a search one).
_KEPT = 16


class GroupCompositions:
    """Configs composed from their config-group overrides alone, the most recent _KEPT of them,
    keyed by the config's name, its search path and those overrides."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple, DictConfig] = OrderedDict()

    def compose(self, config_name: str, overrides: list[str]) -> DictConfig:
        """What `hydra.compose(config_name, overrides)` returns: the groups' composition (made once)
        copied, and the value overrides applied to the copy by Hydra, as its compose applies them."""
        groups, values, search_path = split_overrides(overrides)
        key = (config_name, search_path, tuple(groups))
        base = self._kept.get(key)
        if base is None:
            base = compose(config_name=config_name, overrides=groups)
            self._kept[key] = base
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(key)
        cfg = copy.deepcopy(base)
        apply_values(values, cfg)
        return cfg


COMPOSITIONS = GroupCompositions()


def member_config(overrides: list[str], output_dir: Path) -> DictConfig:
    """A member's own config, composed by Hydra from its job's overrides: what its job alone composes
    (the pack job's own keys are its members' shared ones), in its folder inside the pack's. Hydra's
    own overrides (the launcher, a trial's environment) are the pack job's."""
    mine = [
        o for o in overrides if not key_of(o).startswith(("hydra.", "hydra/", "+hydra", "~hydra"))
    ]
    member = COMPOSITIONS.compose(HydraConfig.get().job.config_name, mine)
    with open_dict(member):
        member.paths.output_dir = str(output_dir)
    return member
