"""Every use of OmegaConf's private API in seqlab's own code, in one place: its YAML dumper
(omegaconf._utils.get_omega_conf_dumper), which OmegaConf.to_yaml writes with. A run's
config.yaml is that of its config resolved once (tracking.describe.resolved), the container its
params are made from too; OmegaConf.to_yaml would resolve it all again (about 6 ms of a run's 10
here, the device x batch study's 630 runs). An OmegaConf upgrade can change the dumper, so the
call checks first that the installed release is one it was tested with, and says so in one line
if not."""

from __future__ import annotations

import functools
from typing import Any

import omegaconf
import yaml
from omegaconf._utils import get_omega_conf_dumper

from seqlab import require_tested

# The OmegaConf releases this use was read against and tested with: Hydra 1.3's pinned 2.3 and
# Hydra 1.4's 2.4 (tests/integration/test_hydra_next.py).
TESTED = ("2.3.", "2.4.")


@functools.cache
def check_version() -> None:
    require_tested("omegaconf", omegaconf.__version__, TESTED, "OmegaConf")


def config_yaml(config: dict[str, Any]) -> str:
    """A resolved config (OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)) as
    OmegaConf.to_yaml(cfg, resolve=True) writes it: the same dumper, the same options."""
    check_version()
    return yaml.dump(
        config,
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
        Dumper=get_omega_conf_dumper(),
    )
