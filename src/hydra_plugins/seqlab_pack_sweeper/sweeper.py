"""Hydra's basic sweeper, packing (registered as `hydra/sweeper=basic`, below): it expands the
command line's sweeps into jobs as Hydra's does, then launches the jobs that differ only in packable
keys as packs (seqlab.sweeps.packs), each pack one job to the launcher, so that packing works with
every launcher (basic, joblib, SLURM). With `pack=off` (the default) it is the basic sweeper: every
job alone. No `from __future__ import annotations` here: Hydra's plugin scan loads this module in a
way that leaves a dataclass with string annotations unable to resolve them."""

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from seqlab.sweeps.packs import (
    PackPlan,
    given,
    group,
    key_of,
    numbered,
    replicated,
    why_unpackable,
)

log = logging.getLogger("seqlab")


@dataclass
class PackingSweeperConf:
    """Hydra's BasicSweeperConf, this class as its target."""

    _target_: str = "hydra_plugins.seqlab_pack_sweeper.sweeper.PackingSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


# In the place of Hydra's `basic` (its module, imported above, registered it first; Hydra scans its
# own plugins before hydra_plugins): every multirun gets packing, and a preset that overrides
# hydra/sweeper (hparams_search=optuna) replaces it whole. With pack=off it is the basic sweeper.
# Hydra 1.4 asks that a replacement say so (replace=True; unsaid, it warns, and 1.5 refuses); 1.3
# has no such parameter and replaces.
_replace = {"replace": True} if "replace" in inspect.signature(ConfigStore.store).parameters else {}
ConfigStore.instance().store(
    group="hydra/sweeper", name="basic", node=PackingSweeperConf, provider="seqlab", **_replace
)


class PackingSweeper(BasicSweeper):
    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None) -> None:
        super().__init__(max_batch_size, params)
        self._why: Dict[tuple, Optional[str]] = {}  # _unpackable's answers

    def _compose(self, overrides: list[str]) -> Any:
        return self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))

    def _unpackable(self, overrides: list[str]) -> Optional[str]:
        """why_unpackable of the job's config, composed once for the jobs that differ only in their
        seed (or pack size), which packing does not depend on: a study's repeats (composing is
        about 0.12 s a job on the 2-core VM; sweep=device_batch composed 70 jobs for 20 answers)."""
        key = tuple(o for o in overrides if key_of(o) not in ("seed", "pack"))
        if key not in self._why:
            self._why[key] = why_unpackable(self._compose(overrides))
        return self._why[key]

    def _seed(self, overrides: list[str]) -> int:
        """The job's seed: as given on the command line where it is a number, else its config's."""
        value = given(overrides, "seed", None)
        if value is not None and value.lstrip("-").isdigit():
            return int(value)
        return self._compose(overrides).seed

    def sweep(self, arguments: List[str]) -> Any:
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = self.split_arguments(parsed, None)[0]
        jobs, left_out = replicated(
            jobs, self.config.get("replicas", 1), self._unpackable, self._seed
        )
        launches, notes = group(jobs, self.config.get("pack", "off"), self._unpackable)
        notes = left_out + notes
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        packs = [launch.members for launch in launches if launch.members is not None]
        for line in notes:
            print(line, flush=True)
        if packs:
            PackPlan(packs).write(sweep_dir)
            print(
                f"pack      {len(jobs)} jobs as {len(launches)} launches: "
                f"{len(packs)} pack(s) of {_sizes(packs)} members",
                flush=True,
            )
        args = numbered(launches)
        # Hydra's sweeper composes each launch of a batch before any starts, so that a bad override
        # fails the sweep at once (the launcher composes it again). A pack's overrides are its
        # members' shared ones, composed above (_unpackable: about 0.12 s each, 30 packs in
        # sweep=device_batch): only the launches alone are composed again here.
        packed = {tuple(a) for launch, a in zip(launches, args) if launch.members is not None}
        batches = self.split_overrides_to_chunks(args, self.max_batch_size)
        returns, first = [], 0
        for batch in batches:
            self.validate_batch_is_legal([a for a in batch if tuple(a) not in packed])
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                _ = r.return_value  # a job that raised fails the sweep, as in the basic sweeper
            first += len(batch)
            returns.append(results)
        return returns


def _sizes(packs: list) -> str:
    """The packs' sizes in a few words: '8', '8, 8, 3', or '15 x 8, 15 x 32' for many."""
    sizes = [len(p) for p in packs]
    if len(sizes) <= 4:
        return ", ".join(str(n) for n in sizes)
    counts: dict[int, int] = {}
    for n in sizes:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c} x {n}" for n, c in counts.items())
