"""Which jobs of a multirun, or trials of a search, train together (issue 22, point 3): jobs whose
overrides differ only in packable keys become packs of at most `pack` members; the sweeper (the
packing basic sweeper, or the search for its trials) launches each pack as one job and writes its
members to the sweep's `packs.json`, which the pack job (seqlab.packing.build) reads back. Light to
import (no torch, Lightning or MLflow): the sweeper runs it before any job starts.

Packable keys are what a member may hold on its own inside one packed step (seqlab.packing.model,
.optim): its seed (initial weights, data, data order, dropout masks), learning rate, L2 factor,
dropout rate and gradient threshold. Everything else is a shape of the computation (batch size,
hidden size, data, device, precision, loop) and keeps jobs apart."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig

from seqlab import SeqlabError
from seqlab.sweeps.trial import ENV_TRIAL

PACKABLE = (
    "seed",
    "optimizer.lr",
    "module.l2_regularization",
    "model.dropout",
    "module.gradient_threshold",
)
# Keys that name a member without changing its computation: its run's name, and a search's trial
# number (the sweeper gives each trial job its own; a pack's member gets it from its overrides).
MEMBER_KEYS = ("logger.run_name", f"hydra.job.env_set.{ENV_TRIAL}")
PACKS_FILE = "packs.json"


def member_dir(pack_output_dir: Path, k: int) -> Path:
    """Member k's own job folder inside its pack's (its result file, checkpoints, curves)."""
    return Path(pack_output_dir) / f"member{k}"


def per_member(key: str) -> bool:
    return key in PACKABLE or key in MEMBER_KEYS


def key_of(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def given(job: list[str], key: str, default: Any) -> Any:
    """`key`'s value in a job's overrides, else `default` (the sweep's own config's)."""
    return next((o.partition("=")[2] for o in job if key_of(o) == key), default)


def _count(value: Any) -> int:
    """A whole number as given on the command line; 0 for anything else."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def pack_size(value: Any) -> Optional[int]:
    """`pack` as members per pack; None: one by one (off, 1)."""
    if value is None or str(value).lower() in ("off", "false", "1"):
        return None
    size = _count(value)
    if size < 1:
        raise SeqlabError(
            f"pack={value}: give the most members a pack may hold (e.g. pack=8), or pack=off"
        )
    return size


def replicated(
    jobs: list[list[str]],
    default: Any,
    unpackable: Callable[[list[str]], Optional[str]],
    seed_of: Callable[[list[str]], int],
) -> tuple[list[list[str]], list[str]]:
    """The jobs with `replicas=K` (K > 1) each as K jobs of its config, seeds seed*K+i (distinct
    across the sweep's seeds), with pack=K so that they train as one pack; and the lines that say
    which jobs were left out because their config cannot pack (replicas exist to be packed: the
    naive loop's K networks one by one would be K jobs, not a measurement of a pack).
    `unpackable(overrides)`: why_unpackable of the job's composed config; `seed_of(overrides)`:
    its seed."""
    out, dropped = [], {}
    for job in jobs:
        count = given(job, "replicas", default)
        k = _count(count)
        if k < 1:
            raise SeqlabError(
                f"replicas={count}: give how many networks of each job's config to train in one pack (1: one)"
            )
        if k == 1:
            out.append(job)
            continue
        why = unpackable(job)
        if why is not None:
            dropped.setdefault(why, []).append(job)
            continue
        seed = seed_of(job)
        rest = [o for o in job if key_of(o) not in ("seed", "pack")]
        out += [[*rest, f"seed={seed * k + i}", f"pack={k}"] for i in range(k)]
    notes = [
        f"replicas  {len(left)} job(s) left out: {why}, and replicas train packed"
        for why, left in dropped.items()
    ]
    if jobs and not out:
        raise SeqlabError(
            f"replicas: no job of this multirun can pack ({next(iter(dropped))}): use replicas=1"
        )
    return out, notes


def why_unpackable(cfg: DictConfig) -> Optional[str]:
    """Why a job's config cannot train packed (one line), None if it can. What only the data can say
    (one step per sample) is checked when the pack's data is loaded."""
    optimizer = str(cfg.optimizer.get("_target_", ""))
    reasons = [
        (cfg.perf.name != "fast", f"perf={cfg.perf.name} trains through Lightning's own loop"),
        (
            optimizer.rpartition(".")[2] not in ("Adam", "AdamW", "SGD", "RMSprop"),
            f"optimizer {optimizer} (packs: adam, adamw, sgdm, rmsprop)",
        ),
        (cfg.ckpt_path is not None, "ckpt_path= (a single run's checkpoint)"),
        (
            not str(cfg.model.get("_target_", "")).endswith(".CNNLSTM"),
            f"model {cfg.model.get('_target_')} (packs: the CNN-LSTM, seqlab.model.CNNLSTM)",
        ),
        (cfg.trainer.accelerator == "mps", "trainer.accelerator=mps"),
    ]
    return next((why for bad, why in reasons if bad), None)


def why_no_refill(cfg: DictConfig) -> Optional[str]:
    """Why a search's trials of this config cannot take each other's slots in a running pack
    (hydra.sweeper.refill, seqlab.sweeps.refill): one line, None if they can. A trial in a freed
    slot counts its own epochs from where it starts, so what the pack does by its own epoch or step
    count cannot be each member's."""
    trainer = cfg.trainer
    launcher = str(cfg.hydra.launcher.get("_target_", "")) if "hydra" in cfg else ""
    reasons = [
        (why_unpackable(cfg) is not None, why_unpackable(cfg)),
        (
            "_target_" in (cfg.get("scheduler") or {}),
            "a learning-rate schedule steps every member by the pack's epochs: scheduler=none",
        ),
        (
            trainer.check_val_every_n_epoch != 1 or trainer.val_check_interval not in (None, 1.0),
            "pruning and the trials' records need one validation an epoch: "
            "trainer.check_val_every_n_epoch=1 trainer.val_check_interval=null",
        ),
        (trainer.max_steps > 0, "trainer.max_steps counts the pack's steps: trainer.max_steps=-1"),
        (
            str(trainer.devices) != "1",
            "a pack across processes keeps its slots: one device",
        ),
        (
            "submitit" in launcher,
            "a requeued pack restarts from its own members, not those that took freed slots: "
            "a local launcher (hydra/launcher=basic or joblib)",
        ),
    ]
    return next((why for bad, why in reasons if bad), None)


@dataclass
class Launch:
    """One job the launcher runs: a job alone, or a pack (`members`: each member's own overrides,
    as it would run alone)."""

    overrides: list[str]
    members: Optional[list[list[str]]] = None


def group(
    jobs: list[list[str]], default_size: Any, unpackable: Any = None
) -> tuple[list[Launch], list[str]]:
    """The launches for a multirun's jobs (each a list of overrides, in the sweeper's order) and the
    lines that say which jobs run alone and why. `unpackable(overrides)`: why_unpackable of that
    job's composed config. A pack's own overrides are its first member's without the per-member
    keys (packable and MEMBER_KEYS), plus `pack_job=N` (set by the caller: `numbered`)."""
    groups: dict[tuple, list[tuple[int, list[str]]]] = {}
    for place, job in enumerate(jobs):
        size = pack_size(given(job, "pack", default_size))
        if size is None:
            groups[("alone", place)] = [(place, job)]
            continue
        shared = tuple(sorted(o for o in job if not per_member(key_of(o))))
        groups.setdefault(("pack", size, shared), []).append((place, job))
    placed: list[tuple[int, Launch]] = []  # each launch where its first job stood
    notes = []
    for key, members in groups.items():
        if key[0] == "alone":
            placed.append((members[0][0], Launch(members[0][1])))
            continue
        size = key[1]
        why = unpackable(members[0][1]) if unpackable is not None else None
        if why is not None:
            notes.append(
                f"pack      {len(members)} job(s) ({' '.join(key[2]) or 'defaults'}) train one by one: {why}"
            )
            placed += [(place, Launch(job)) for place, job in members]
            continue
        for start in range(0, len(members), size):
            chunk = members[start : start + size]
            jobs_of = [job for _, job in chunk]
            launch = (
                Launch(jobs_of[0])
                if len(chunk) == 1
                else Launch([o for o in jobs_of[0] if not per_member(key_of(o))], jobs_of)
            )
            placed.append((chunk[0][0], launch))
    # In the sweeper's order (the seed slowest in sweep=device_batch: a slow minute of a shared
    # machine falls on every configuration alike), a pack where its first member stood.
    return [launch for _, launch in sorted(placed, key=lambda p: p[0])], notes


def numbered(launches: list[Launch], first_pack: int = 0) -> list[list[str]]:
    """Each launch's override list, a pack's with `pack_job=N`, N counting from `first_pack` (a
    search launches batch after batch into one sweep's plan)."""
    out, n = [], first_pack
    for launch in launches:
        if launch.members is None:
            out.append(launch.overrides)
        else:
            out.append([*launch.overrides, f"pack_job={n}"])
            n += 1
    return out


def pack_launches(
    jobs: list[list[str]], default_size: Any, unpackable: Any, packs: list[list[list[str]]]
) -> tuple[list[tuple[list[str], list[int]]], list[str]]:
    """group and numbered for a search's batch of trials: each launch's overrides and the places
    in `jobs` of the jobs it trains, and the lines group says; each new pack is appended to
    `packs` (the sweep's plan so far: pack numbers go on from batch to batch)."""
    planned, notes = group(jobs, default_size, unpackable)
    out = []
    for launch, args in zip(planned, numbered(planned, first_pack=len(packs))):
        members = launch.members or [launch.overrides]
        out.append((args, [jobs.index(m) for m in members]))
        if launch.members:
            packs.append(launch.members)
    return out, notes


@dataclass
class PackPlan:
    """packs.json: every pack of the sweep, its members' overrides."""

    packs: list[list[list[str]]]

    def write(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PACKS_FILE).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, sweep_dir: Path) -> "PackPlan":
        path = sweep_dir / PACKS_FILE
        if not path.is_file():
            raise SeqlabError(
                f"pack_job= is set by the sweeper (python train.py -m ... pack=N); {path} is missing"
            )
        return cls(**json.loads(path.read_text()))
