"""Packs that never idle (hydra.sweeper.refill=true, issue 36 point 4): in a packed search, a member
that ends before its pack (pruned, diverged, or done while a newer member trains on) gives its slot
to the next trial the study asks for, inside the running pack: asynchronous successive halving in
one step. The sweeper (seqlab.sweeps.search) checks that its trials can take each other's slots and
puts what the pack job needs in the environment (`refill_settings`); the pack job asks the study
for the trial (`Refiller`, the same asking rules as a worker's: free slots, a retry run once, none
past n_trials), trains it in the freed slot (seqlab.packing.refill), tells the study how each of
its members' trials ended as its run ends, and writes which trials it took (`RefillLog`), which the
sweeper reports with its own (`refilled_trials`) or, stopped, fails (`refilled_under`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import optuna

from seqlab.sweeps import optuna_private, workers
from seqlab.sweeps.packs import MEMBER_KEYS, PACKABLE, key_of, why_no_refill
from seqlab.sweeps.study import (
    SearchError,
    make_pruner,
    make_sampler,
    overrides_for,
    storage_for,
)
from seqlab.sweeps.trial import ENV_REFILL, ENV_STORAGE, ENV_STUDY, ENV_TRIAL

REFILLS_FILE = "refills.json"  # in the pack job's folder: the trials it took, and their folders


def check_refill(refill: Any, pack: Optional[int], space: Mapping[str, Any], cfg: Any) -> None:
    """hydra.sweeper.refill=true: any trial must be able to take any other's slot in a pack and
    train there as its job alone. `cfg`: the search's starting config. Raises SearchError."""
    if refill is not True:
        raise SearchError(f"hydra.sweeper.refill must be true or false, got {refill!r}")
    if pack is None:
        raise SearchError(
            "hydra.sweeper.refill=true gives a pack's freed slots to the next trials: add pack=N (N >= 2)"
        )
    other = next((k for k in space if k not in PACKABLE or k == "seed"), None)
    if other is not None:
        raise SearchError(
            f"hydra.sweeper.refill=true: trials take each other's slots, so they may differ only in "
            f"{', '.join(k for k in PACKABLE if k != 'seed')}; {other} is searched (leave it out "
            f"with hydra.sweeper.params.{other}=null, or refill=false)"
        )
    why = why_no_refill(cfg)
    if why is not None:
        raise SearchError(f"hydra.sweeper.refill=true: {why}")


def refill_settings(
    n_trials: int, space: Mapping[str, optuna.distributions.BaseDistribution], sampler: Mapping
) -> str:
    """What a pack job needs to ask the study for trials itself (ENV_REFILL, in the environment
    every launcher passes on, beside the study's own: seqlab.sweeps.trial.study_environment)."""
    return json.dumps(
        {
            "n_trials": n_trials,
            "space": {k: optuna.distributions.distribution_to_json(d) for k, d in space.items()},
            "sampler": dict(sampler),
        }
    )


def refilled_under(sweep_dir: Path, study: optuna.Study) -> list[optuna.trial.Trial]:
    """Every trial the sweep's pack jobs took into freed slots so far (a stopped search fails those
    still running, as it fails its own: seqlab.sweeps.search_outcomes.tell_interrupted)."""
    return [
        trial
        for path in sorted(Path(sweep_dir).glob(f"*/{REFILLS_FILE}"))
        for trial, _ in _taken(study, path.parent)
    ]


def refilled_trials(study: optuna.Study, batch_returns: list) -> list[tuple]:
    """The trials a batch's pack jobs took into freed slots (their refills.json), each with its
    pack job's return and its member's folder: the sweeper tells them as it tells its own."""
    found = []
    for ret in batch_returns:
        try:
            folder = Path(ret.hydra_cfg.hydra.runtime.output_dir)
        except Exception:  # noqa: BLE001 - a job that failed to compose has no hydra_cfg
            continue
        found += [(trial, ret, member) for trial, member in _taken(study, folder)]
    return found


def _taken(study: optuna.Study, folder: Path) -> list[tuple[optuna.trial.Trial, int]]:
    """The trials the pack job in `folder` took (its refills.json), each with its member's folder."""
    return [
        (optuna_private.trial_by_number(study, taken["trial"]), taken["member"])
        for taken in RefillLog.read(folder).taken
    ]


def refilled_overrides(overrides: list[str], trial: optuna.trial.Trial) -> list[str]:
    """A trial's overrides in a slot: the pack member's it replaces, its searched keys and its name
    (MEMBER_KEYS) as the sweeper gives a trial's job alone (seqlab.sweeps.search)."""
    searched = set(trial.params)
    kept = [o for o in overrides if key_of(o) not in searched and key_of(o) not in MEMBER_KEYS]
    return [
        *kept,
        *overrides_for(trial.params),
        f"logger.run_name=trial-{trial.number}",
        f"++hydra.job.env_set.{ENV_TRIAL}={trial.number}",
    ]


class Refiller:
    """The study, as a pack job asks it for the trial that takes a freed slot."""

    def __init__(self, storage: str, study: str, settings: Mapping[str, Any]) -> None:
        self.storage_url, self.study_name = storage, study
        self.n_trials = int(settings["n_trials"])
        self.space = {
            k: optuna.distributions.json_to_distribution(d) for k, d in settings["space"].items()
        }
        self.sampler_spec = dict(settings.get("sampler") or {})
        self.study: Optional[optuna.Study] = None

    @classmethod
    def from_environment(cls) -> Optional["Refiller"]:
        """The refiller of this pack job, if its search refills (None otherwise)."""
        settings = os.environ.get(ENV_REFILL)
        if not settings or ENV_STUDY not in os.environ or ENV_STORAGE not in os.environ:
            return None
        return cls(os.environ[ENV_STORAGE], os.environ[ENV_STUDY], json.loads(settings))

    def _open(self) -> optuna.Study:
        if self.study is None:
            storage = storage_for(self.storage_url)
            study_id = storage.get_study_id_from_name(self.study_name)
            pruner = make_pruner(
                storage.get_study_user_attrs(study_id).get("seqlab_pruner") or {"name": "none"}
            )
            seed = self.sampler_spec.get("seed")
            # The sweeper's sampler, drawing on from the trials so far (not its first draws again).
            trials = len(storage.get_all_trials(study_id, deepcopy=False))
            sampler = make_sampler(self.sampler_spec, None if seed is None else seed + trials, True)
            self.study = optuna.load_study(
                study_name=self.study_name, storage=storage, sampler=sampler, pruner=pruner
            )
        return self.study

    def next_trial(self) -> Optional[optuna.trial.Trial]:
        """The study's next trial for this pack, or None where its n_trials are all taken."""
        study = self._open()
        if workers.free_slots(study, self.n_trials) <= 0:
            return None
        trial = study.ask(self.space)
        workers.taken(trial)
        kept = workers.settle(study, [trial], self.n_trials)
        return kept[0] if kept else None


@dataclass
class RefillLog:
    """refills.json in a pack job's folder: each trial the job took into a freed slot, with the
    folder of its member (member<N>, N counting on from the pack's own members)."""

    taken: list[dict[str, int]] = field(default_factory=list)

    def add(self, folder: Path, trial: int, member: int) -> None:
        self.taken.append({"trial": trial, "member": member})
        (folder / REFILLS_FILE).write_text(json.dumps(self.taken, indent=1))

    @classmethod
    def read(cls, folder: Path) -> "RefillLog":
        path = folder / REFILLS_FILE
        return cls(json.loads(path.read_text()) if path.is_file() else [])
