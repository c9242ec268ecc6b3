"""What a search (seqlab.sweeps.search, the sweeper's process) and its trials (seqlab.sweeps.trial,
the jobs) share of an Optuna study: the search space read from `hydra.sweeper.params`, the
sampler and pruner made from their settings, the study's storage, the names of the attributes
stored on it and its trials, and values written back as Hydra overrides. Optuna is imported where
it is used: the sweep callback, in every multirun, reads only the names here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from seqlab import SeqlabError

if TYPE_CHECKING:
    import optuna

_FIELDS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}
SEARCH_DIR = "search"  # in the sweep folder and on the parent run
VERDICT_FILE = "search_verdict.txt"  # printed by the sweep callback after its summary
# Trial user attributes.
STARTING = "starting_config"  # the config's own values
INTERRUPTED = "interrupted"  # stopped by Ctrl-C or SIGTERM: run again with the same values
RETRY_OF = "retry_of"  # on the trial that runs an interrupted one's values again


class SearchError(SeqlabError):
    """A search that cannot start: said in one line, before any trial trains."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_space(params: Mapping[str, Any]) -> dict[str, optuna.distributions.BaseDistribution]:
    """hydra.sweeper.params -> Optuna distributions; SearchError names the first bad entry."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    if not params:
        raise SearchError("hydra.sweeper.params is empty: give at least one key to search, e.g. "
                          "optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}")
    for key, spec in params.items():
        where = f"hydra.sweeper.params.{key}"
        if isinstance(spec, (list, tuple)):
            spec = {"type": "categorical", "choices": list(spec)}
        if not isinstance(spec, Mapping):
            raise SearchError(f"{where}: give {{type: float|int|categorical, ...}} or a list of choices, got {spec!r}")
        kind = spec.get("type")
        if kind not in _FIELDS:
            raise SearchError(f"{where}: unknown distribution {kind!r}; use type: float, int or categorical")
        extra = sorted(set(spec) - _FIELDS[kind])
        if extra:
            raise SearchError(f"{where}: {kind} takes {', '.join(sorted(_FIELDS[kind] - {'type'}))}; not {', '.join(extra)}")
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, (list, tuple)) or not choices:
                raise SearchError(f"{where}: categorical needs a non-empty list of choices, got {choices!r}")
            if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
                raise SearchError(f"{where}: choices must be numbers, strings, booleans or null, got {choices!r}")
            space[key] = CategoricalDistribution(list(choices))
            continue
        low, high, log_scale, step = spec.get("low"), spec.get("high"), bool(spec.get("log", False)), spec.get("step")
        if not (_number(low) and _number(high)):
            raise SearchError(f"{where}: {kind} needs numbers low and high, got low={low!r} high={high!r}")
        if low >= high:
            raise SearchError(f"{where}: empty range: low={low} must be below high={high}")
        if log_scale and low <= 0:
            raise SearchError(f"{where}: a log range must stay above 0, got low={low}; raise low, or drop log: true")
        if step is not None and (not _number(step) or step <= 0):
            raise SearchError(f"{where}: step must be a positive number, got {step!r}")
        if log_scale and step is not None:
            raise SearchError(f"{where}: log: true and step cannot be combined (Optuna samples one or the other)")
        if kind == "int":
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high, step or 1)):
                raise SearchError(f"{where}: int needs whole numbers, got low={low} high={high} step={step}")
            space[key] = IntDistribution(low, high, log=log_scale, step=step or 1)
        else:
            space[key] = FloatDistribution(float(low), float(high), log=log_scale, step=step)
    return space


def flatten_space(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{optimizer: {lr: {type: ...}}} and {optimizer.lr: {type: ...}} alike -> {'optimizer.lr': {...}}.
    Nested keys let the command line change one field (hydra.sweeper.params.optimizer.lr.high=0.1);
    an entry set to null is left out of the search."""
    flat: dict[str, Any] = {}
    for key, spec in params.items():
        name = f"{prefix}{key}"
        if spec is None:
            continue
        if isinstance(spec, Mapping) and "type" not in spec and spec:
            flat.update(flatten_space(spec, f"{name}."))
        else:
            flat[name] = spec
    return flat


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


def make_sampler(spec: Mapping[str, Any], seed: Optional[int], parallel: bool) -> optuna.samplers.BaseSampler:
    import optuna

    name = spec.get("name", "tpe")
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: trials launched together are steered apart instead of drawn alike.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=int(spec.get("n_startup_trials", 10)),
                                      constant_liar=parallel)


def make_pruner(spec: Mapping[str, Any]) -> optuna.pruners.BasePruner:
    """The search's pruner; each job (seqlab.sweeps.trial) makes it again from the settings stored with the study."""
    import optuna

    name = spec.get("name", "median")
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(spec.get("n_startup_trials", 5)),
                                           n_warmup_steps=int(spec.get("n_warmup_steps", 1)))
    if name == "hyperband":
        max_resource = spec.get("max_resource", "auto")
        return optuna.pruners.HyperbandPruner(min_resource=int(spec.get("min_resource", 1)),
                                              max_resource=max_resource if max_resource == "auto" else int(max_resource),
                                              reduction_factor=int(spec.get("reduction_factor", 3)))
    return optuna.pruners.NopPruner()


JOURNAL = "journal:///"  # Optuna's journal file storage: journal:///path/to/study.log


def storage_for(url: str, heartbeat: Optional[tuple[int, int, Callable]] = None) -> optuna.storages.BaseStorage:
    """The study's storage: a database (SQLAlchemy URL), or Optuna's journal file (journal:///path,
    an append-only log with its own file lock: safe on NFS, no server). SQLite takes one writer at a
    time: jobs side by side wait for the lock (up to a minute) instead of failing at once.
    `heartbeat`: (interval s, grace period s, failed-trial callback) for the searching process,
    whose trials' heartbeats tell a dead worker from a live one (seqlab.sweeps.workers)."""
    import optuna

    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = Path("/" + url[len(JOURNAL):].lstrip("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    beats = {} if heartbeat is None else dict(heartbeat_interval=heartbeat[0], grace_period=heartbeat[1],
                                              heartbeat_stale_trial_callback=heartbeat[2])
    # Workers started together on a new study database race to create its tables (measured: two
    # searches started at once on a new SQLite file, one failed on alembic_version's UNIQUE
    # constraint). A SQLite file is created under its lock file, one process at a time; a database
    # server's tables by whoever gets there first, the others trying again once it is done.
    if url.startswith("sqlite:///"):
        from seqlab.store.local import store_lock

        with store_lock(Path(url[len("sqlite:///"):])):
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}, **beats)
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, **beats)
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's IntegrityError/ProgrammingError of the race
            if attempt == 2 or not any(word in str(error) for word in ("alembic_version", "already exists", "duplicate")):
                raise
            time.sleep(1.0)
