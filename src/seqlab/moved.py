"""Where modules went when src/seqlab was sorted into packages, and what keeps the old paths working.
What a user already has names them:
- a run recorded before the move stores `_target_` params with the old paths: `resume=` and the
  comparison's grouping of repeats read them as the paths they moved to (`param_now`);
- a user's own config (`_target_: seqlab.module.SeqRegressor`) or command line
  (`python -m seqlab.server`) imports the module where it is now (`install`: an import hook that
  answers only for the old names below, and only after Python's own finders found nothing).

`seqlab.store` and `seqlab.callbacks` are packages now under their old names (the store's module
is `seqlab.store.local`; the callbacks' `build` is still `seqlab.callbacks.build`). Modules are
aliased, not names: the few functions that moved between modules on the way (a resume point's
publish/drop to `seqlab.resume.points`, `continue_job` and `resume_command` to `seqlab.sweeps.job`,
the study's helpers to `seqlab.sweeps.study`) are found at their new homes only; no config or
command line names them. `python -m OLD` runs the module with `__package__` of the old name:
`seqlab.store.server` and `seqlab.tracking.step_writer` import absolutely, as they must stay."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Optional

MOVED = {
    "seqlab.best": "seqlab.callbacks.best",
    "seqlab.checkpoints": "seqlab.resume.checkpoints",
    "seqlab.compare": "seqlab.sweeps.compare",
    "seqlab.cudagraph": "seqlab.training.cudagraph",
    "seqlab.datasets": "seqlab.tracking.datasets",
    "seqlab.devices": "seqlab.training.devices",
    "seqlab.ghosts": "seqlab.store.ghosts",
    "seqlab.gradients": "seqlab.training.gradients",
    "seqlab.interrupt": "seqlab.resume.interrupt",
    "seqlab.job": "seqlab.sweeps.job",
    "seqlab.lightning_private": "seqlab.training.lightning_private",
    "seqlab.loop": "seqlab.training.loop",
    "seqlab.model_logging": "seqlab.tracking.model_logging",
    "seqlab.module": "seqlab.training.module",
    "seqlab.outbox": "seqlab.tracking.outbox",
    "seqlab.output_network": "seqlab.callbacks.output_network",
    "seqlab.perf": "seqlab.training.perf",
    "seqlab.profiling": "seqlab.training.profiling",
    "seqlab.progress": "seqlab.callbacks.progress",
    "seqlab.pruning": "seqlab.sweeps.pruning",
    "seqlab.rank_watch": "seqlab.ddp.rank_watch",
    "seqlab.ranks": "seqlab.ddp.ranks",
    "seqlab.replayed_steps": "seqlab.tracking.replayed_steps",
    "seqlab.safe_writes": "seqlab.resume.safe_writes",
    "seqlab.search": "seqlab.sweeps.search",
    "seqlab.search_report": "seqlab.sweeps.search_report",
    "seqlab.server": "seqlab.store.server",
    "seqlab.server_auth": "seqlab.store.server_auth",
    "seqlab.stats": "seqlab.sweeps.stats",
    "seqlab.step_writer": "seqlab.tracking.step_writer",
    "seqlab.sweep": "seqlab.sweeps.callback",
    "seqlab.timing": "seqlab.callbacks.timing",
    "seqlab.trial": "seqlab.sweeps.trial",
    "seqlab.ui": "seqlab.store.ui",
}


def now(path: str) -> str:
    """A dotted path (a module, or a name in one) as it is now: `seqlab.module.SeqRegressor` ->
    `seqlab.training.module.SeqRegressor`; any other path as given."""
    for old, new in MOVED.items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old):]
    return path


def param_now(key: str, value: Any) -> Any:
    """A recorded param's value as this version would record it: a `_target_` naming an old path
    names the path it moved to."""
    if key.rsplit(".", 1)[-1] == "_target_" and isinstance(value, str):
        return now(value)
    return value


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import seqlab.module` gives the module at `seqlab.training.module` (the same module object,
    so its classes are the same classes); `python -m seqlab.server` runs `seqlab.store.server`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        new = MOVED.get(name)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        return importlib.util.spec_from_loader(name, self, origin=found.origin if found else None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        warnings.warn(f"{spec.name} is {MOVED[spec.name]} now: name that instead", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system sets the old name's spec on it next
        return module

    def exec_module(self, module: Any) -> None:
        # Already executed under its own name: it only gets its own spec back, so that it stays
        # one module with one name.
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, name: str) -> Any:
        """What runpy (python -m OLD) runs: the code of the module where it is now."""
        new = MOVED[name]
        warnings.warn(f"python -m {name}: it is python -m {new} now", DeprecationWarning, stacklevel=2)
        return importlib.util.find_spec(new).loader.get_code(new)


def install() -> None:
    """Answer for the old paths, after every other finder (so they cost nothing to other imports)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
