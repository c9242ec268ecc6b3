"""Ranks and processes: which process of a multi-process (DDP) job this is, whether the trainer
settings start more than one, the scope a DDP job's process group lives in, and how Lightning's
launcher starts the other processes as this job. Light imports only (sweeps/job.py uses it on the CLI's
start-up path)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from seqlab import SeqlabError

RANK_OVERRIDES = "SEQLAB_RANK_OVERRIDES"  # a DDP job's overrides, for the ranks it starts (start_ranks_as_this_job)
RANK_PACK = "SEQLAB_RANK_PACK"  # a DDP pack's sweep, job and members, for the ranks it starts


def rank_overrides() -> list[str]:
    """In a rank that start_ranks_as_this_job started (LOCAL_RANK > 0): the job's overrides,
    which came in the environment; elsewhere nothing."""
    given = os.environ.pop(RANK_OVERRIDES, None)
    if not given or os.environ.get("LOCAL_RANK", "0") == "0":
        return []
    return list(json.loads(given))


def handed_pack() -> Optional[dict]:
    """In a rank that a DDP pack's rank 0 started: the pack as rank 0 decided it (`sweep_dir`,
    `num`, and `members`: each member it trains, its place `k`, the run it continues and whether it
    ended before), so that every process trains the same members the same way; None elsewhere."""
    given = os.environ.get(RANK_PACK)
    if not given or os.environ.get("LOCAL_RANK", "0") == "0":
        return None
    return json.loads(given)


def process_rank() -> int:
    """Which process of a multi-process (DDP) job this is: 0 for the one that started the job.
    The variables Lightning's launchers, torchrun and SLURM set, in Lightning's order; on a
    node other than the first (NODE_RANK > 0, without a global RANK), never 0."""
    rank = 0
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            rank = int(os.environ[key])
            break
    node = int(os.environ.get("NODE_RANK") or 0)
    if node > 0 and "RANK" not in os.environ:
        return node * 100_000 + rank
    return rank


def multi_process(trainer_cfg: Any) -> bool:
    """Whether the trainer settings (cfg.trainer) start more than one training process (DDP)."""

    devices = trainer_cfg.devices
    one_device = devices in (1, "1") or (OmegaConf.is_list(devices) and len(devices) == 1)
    return trainer_cfg.strategy != "auto" or trainer_cfg.num_nodes > 1 or not one_device


def local_processes(trainer_cfg: Any) -> int:
    """The training processes a job starts on each machine: trainer.devices where it gives a count
    (a number or a list of devices) and the job is DDP; 1 where Lightning decides ("auto", -1)."""
    devices = trainer_cfg.devices
    if not multi_process(trainer_cfg):
        return 1
    if OmegaConf.is_list(devices):
        return len(devices)
    return int(devices) if str(devices).isdigit() else 1


@contextmanager
def process_group_scope(trainer_cfg: Any) -> Iterator[None]:
    """A DDP job leaves its process group and the launcher's variables (MASTER_PORT, ...) behind;
    the next job of a sweep in the same process would join that dead group. Both end with the job."""
    if not multi_process(trainer_cfg):
        yield
        return
    keys = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NODE_RANK",
        "LOCAL_RANK",
        "RANK",
        RANK_PACK,
    )
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        import torch.distributed as dist  # torch: only under DDP (every command line imports this module)

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_ranks_as_this_job(
    output_dir: Path, overrides: list[str], pack: Optional[dict] = None
) -> None:
    """Lightning's DDP launcher starts ranks 1..N-1 by running the command line again, which in a
    multirun would start the whole sweep again (and from a launcher's worker, not train.py at
    all). Each rank is started as a single run of this job instead: train.py with the job's
    overrides, in the job's output folder; a pack's ranks with the pack as rank 0 decided it
    (`pack`: handed_pack)."""

    from seqlab.training.lightning_private import (  # Lightning: only under DDP
        set_ddp_process_command,
    )

    if not HydraConfig.initialized():
        raise SeqlabError(
            "multi-process training (trainer.devices > 1 or trainer.strategy=ddp) starts through the CLI: "
            "python train.py trainer.devices=N trainer.strategy=ddp ..."
        )
    hc = HydraConfig.get()
    entry = os.environ.get("SEQLAB_ENTRY") or str(
        Path(os.environ.get("SEQLAB_ROOT", ".")) / "train.py"
    )
    # The same config: its name, where it was found, and any added search path.
    config = ["--config-name", hc.job.config_name]
    for source in hc.runtime.config_sources:
        if source.schema == "file" and source.provider in ("main", "command-line"):
            config += [
                "--config-path" if source.provider == "main" else "--config-dir",
                source.path,
            ]
    config += [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath")]

    # The job's overrides go to the ranks in their environment (inherited: Lightning copies this
    # process's environment for each), not on their command lines, which every user of the
    # machine can read (ps) and which may hold a password the user typed.
    os.environ[RANK_OVERRIDES] = json.dumps(list(overrides))
    if pack is not None:
        os.environ[RANK_PACK] = json.dumps(pack)

    def command(local_rank: int) -> tuple[list[str], str]:
        return [
            sys.executable,
            entry,
            *config,
            f'hydra.run.dir="{output_dir}"',
            f"hydra.job.name=train_ddp_process_{local_rank}",
            "hydra.output_subdir=null",  # rank 0 wrote .hydra/
        ], hc.runtime.cwd

    set_ddp_process_command(command)
