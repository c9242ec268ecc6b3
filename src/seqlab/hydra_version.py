"""The `version_base` to hand Hydra, on its 1.3 line and the next.

Hydra 1.3 needs it said (without it, 1.1's defaults and a warning: the job would change its
working folder); Hydra 1.4 warns on any value given (Hydra15MigrationWarning) and 1.5 drops the
parameter. So: "1.3" on 1.3, nothing from 1.4 on. Every @hydra.main and initialize_config_dir
takes `**VERSION_BASE`."""

from __future__ import annotations

import contextlib
from typing import Any

import hydra


def _line(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


VERSION_BASE: dict[str, str] = {"version_base": "1.3"} if _line(hydra.__version__) < (1, 4) else {}


# What seqlab's configs name as _target_ (its own classes, Hydra's plugins, torch's optimizers and
# schedulers, Lightning's callbacks): Hydra 1.4 asks for such a list before it calls a target a
# config names (an execution whitelist; without one it warns, and 1.5 refuses).
TRUSTED_TARGETS = (
    "seqlab.*",
    "hydra_plugins.*",
    "hydra.*",
    "torch.optim.*",
    "pytorch_lightning.*",
    "lightning.*",
)


def trusted_targets() -> Any:
    """A context in which Hydra instantiates only TRUSTED_TARGETS (Hydra 1.4); on 1.3, which has no
    such check, nothing. Entered by the command lines and by the task function (a launcher's
    worker process starts without the command line's context)."""
    try:
        from hydra.utils import execution_whitelist  # Hydra 1.4 only: 1.3 has no such check
    except ImportError:
        return contextlib.nullcontext()
    return execution_whitelist(list(TRUSTED_TARGETS))
