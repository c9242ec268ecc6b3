"""Every use of Hydra's private API in seqlab's own code, in one place (the pack sweeper plugin
subclasses Hydra's BasicSweeper, as Hydra's plugins do). What its public API does not offer is its
compose in two steps: Hydra composes a config (hydra._internal.config_loader_impl,
_load_configuration_impl) from the overrides that choose config groups (`perf=fast`,
`sweep=device_batch`), which build the defaults list and the merged config, and then applies the
overrides of values (`seed=5`, `optimizer.lr=0.01`, `+x=1`, `~y`) to that config with a function
of its own. A pack's members share the first step (packing.configs). A Hydra upgrade can
break these, so each call checks first that the installed Hydra is one they were tested with, and
says so in one line if not."""

from __future__ import annotations

import functools

import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import Overrides
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

from seqlab import require_tested

# The Hydra releases these uses were read against and tested with: the pinned 1.3 and the next
# line's prerelease (tests/integration/test_hydra_next.py).
TESTED = ("1.3.", "1.4.")


@functools.cache
def check_version() -> None:

    require_tested("hydra-core", hydra.__version__, TESTED, "Hydra")


@functools.cache
def _parser() -> OverridesParser:
    return OverridesParser.create()  # its grammar built once a process


def split_overrides(overrides: list[str]) -> tuple[list[str], list[Override], tuple[str, ...]]:
    """`overrides` as Hydra's compose sees them: those that choose config groups (as written), those
    that set values (parsed, for `apply_values`), and the config search path they are read against."""
    check_version()
    loader = GlobalHydra.instance().hydra.config_loader
    parsed = _parser().parse_overrides(overrides)
    values = Overrides(loader.repository, parsed).config_overrides
    value_ids = {id(o) for o in values}
    groups = [o.input_line for o in parsed if id(o) not in value_ids]
    search_path = tuple(str(p.path) for p in loader.get_search_path().config_search_path)
    return groups, values, search_path


def apply_values(values: list[Override], cfg: DictConfig) -> None:
    """The overrides of values applied to a composed config, by Hydra's compose's own function."""
    check_version()
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
