"""What a search (seqlab.sweeps.search, the sweeper's process) and its trials (seqlab.sweeps.trial,
the jobs) share of an Optuna study: the sampler and pruner made from their settings, the study's
storage, the names of the attributes stored on it and its trials, and values written back as Hydra
overrides (the search space itself: seqlab.sweeps.space). Optuna is imported where
it is used: the sweep callback, in every multirun, reads only the names here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from seqlab import SeqlabError

if TYPE_CHECKING:
    import optuna

SEARCH_DIR = "search"  # in the sweep folder and on the parent run
VERDICT_FILE = "search_verdict.txt"  # printed by the sweep callback after its summary
# Trial user attributes.
STARTING = "starting_config"  # the config's own values
INTERRUPTED = "interrupted"  # stopped by Ctrl-C or SIGTERM: run again with the same values
RETRY_OF = "retry_of"  # on the trial that runs an interrupted one's values again


class SearchError(SeqlabError):
    """A search that cannot start: said in one line, before any trial trains."""


def override_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back unchanged."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text.replace("_", "").replace("-", "").replace(".", "").replace("/", "").isalnum():
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def overrides_for(params: Mapping[str, Any]) -> list[str]:
    return [f"{key}={override_value(value)}" for key, value in params.items()]


def make_sampler(
    spec: Mapping[str, Any], seed: Optional[int], parallel: bool
) -> optuna.samplers.BaseSampler:
    import optuna  # Optuna: a search only (every job imports this module)

    name = spec.get("name", "tpe")
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: trials launched together are steered apart instead of drawn alike.
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=int(spec.get("n_startup_trials", 10)), constant_liar=parallel
    )


def make_pruner(spec: Mapping[str, Any]) -> optuna.pruners.BasePruner:
    """The search's pruner; each job (seqlab.sweeps.trial) makes it again from the settings stored with the study."""
    import optuna  # Optuna: a search only (every job imports this module)

    name = spec.get("name", "median")
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(spec.get("n_startup_trials", 5)),
            n_warmup_steps=int(spec.get("n_warmup_steps", 1)),
        )
    if name == "hyperband":
        max_resource = spec.get("max_resource", "auto")
        return optuna.pruners.HyperbandPruner(
            min_resource=int(spec.get("min_resource", 1)),
            max_resource=max_resource if max_resource == "auto" else int(max_resource),
            reduction_factor=int(spec.get("reduction_factor", 3)),
        )
    return optuna.pruners.NopPruner()


JOURNAL = "journal:///"  # Optuna's journal file storage: journal:///path/to/study.log


def storage_for(
    url: str, heartbeat: Optional[tuple[int, int, Callable]] = None
) -> optuna.storages.BaseStorage:
    """The study's storage: a database (SQLAlchemy URL), or Optuna's journal file (journal:///path,
    an append-only log with its own file lock: safe on NFS, no server). SQLite takes one writer at a
    time: jobs side by side wait for the lock (up to a minute) instead of failing at once.
    `heartbeat`: (interval s, grace period s, failed-trial callback) for the searching process,
    whose trials' heartbeats tell a dead worker from a live one (seqlab.sweeps.workers)."""
    import optuna  # Optuna: a search only (every job imports this module)

    if url.startswith(JOURNAL):
        from optuna.storages.journal import (  # Optuna: a search only (every job imports this module)
            JournalFileBackend,
            JournalFileOpenLock,
        )

        path = Path("/" + url[len(JOURNAL) :].lstrip("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(
            JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path)))
        )
    beats = (
        {}
        if heartbeat is None
        else dict(
            heartbeat_interval=heartbeat[0],
            grace_period=heartbeat[1],
            heartbeat_stale_trial_callback=heartbeat[2],
        )
    )
    # Workers started together on a new study database race to create its tables (measured: two
    # searches started at once on a new SQLite file, one failed on alembic_version's UNIQUE
    # constraint). A SQLite file is created under its lock file, one process at a time; a database
    # server's tables by whoever gets there first, the others trying again once it is done.
    if url.startswith("sqlite:///"):
        from seqlab.store.local import store_lock  # a SQLite study only

        with store_lock(Path(url[len("sqlite:///") :])):
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": 60}}, **beats
            )
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, **beats)
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's IntegrityError/ProgrammingError of the race
            if attempt == 2 or not any(
                word in str(error) for word in ("alembic_version", "already exists", "duplicate")
            ):
                raise
            time.sleep(1.0)
