"""What a task knows about the Hydra job it runs in, and the small files that connect a
multirun's jobs to their sweep: `sweep.json` (written once by the sweep callback) and one
`seqlab_job.json` per job (written by the job, read back for the sweep summary). Files, not
in-memory state, so that launchers running jobs in other processes work the same way."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from seqlab.ranks import process_rank
from seqlab.secrets import mask_text

SWEEP_FILE = "sweep.json"
JOB_FILE = "seqlab_job.json"


def fmt(value: Any, spec: str = ".4g") -> str:
    """A number for a summary table or report line; "-" where there is none."""
    return "-" if value is None else format(value, spec)


def cpu_count() -> int:
    """The cores this process may use (a container or taskset may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class Job:
    output_dir: Path
    overrides: list[str] = field(default_factory=list)
    sweep_dir: Optional[Path] = None  # set in a multirun
    num: Optional[int] = None
    result: Optional["JobResult"] = None  # what this job has written so far
    rank: int = field(default_factory=process_rank)  # > 0: a helper process of a DDP job
    concurrent_jobs: int = 1  # jobs a parallel launcher runs at once on this machine

    def write(self, result: "JobResult") -> None:
        """The job's result file; only rank 0 speaks for the job."""
        self.result = result
        if self.rank == 0:
            result.write(self.output_dir)

    @property
    def multirun(self) -> bool:
        return self.sweep_dir is not None

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> "Job":
        """The current Hydra job; outside Hydra (tests, notebooks) a single run in
        cfg.paths.output_dir."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        output_dir = Path(cfg.paths.output_dir)
        if not HydraConfig.initialized():
            return cls(output_dir)
        hc = HydraConfig.get()
        overrides = list(hc.overrides.task)
        if hc.mode == RunMode.MULTIRUN:
            job = cls(output_dir, overrides, Path(hc.sweep.dir), hc.job.num)
            if "joblib" in hc.launcher.get("_target_", ""):
                n_jobs = int(hc.launcher.get("n_jobs") or 1)
                job.concurrent_jobs = n_jobs if n_jobs > 0 else max(1, cpu_count() + 1 + n_jobs)  # joblib's -1: all
            return job
        return cls(output_dir, overrides)

    def sweep_info(self) -> dict[str, Any]:
        if self.sweep_dir is None:
            return {}
        path = self.sweep_dir / SWEEP_FILE
        return json.loads(path.read_text()) if path.is_file() else {}


def routed_tracking_uri(sweep: dict[str, Any], uri: str) -> str:
    """A job of a parallel sweep whose runs go to a local SQLite store logs through the loopback
    server the sweep started over that store (sweep.json: store_uri -> tracking_uri)."""
    if sweep.get("store_uri") and sweep.get("store_uri") == uri:
        return sweep["tracking_uri"]
    return uri


@dataclass
class JobResult:
    status: str  # RUNNING | FINISHED | FAILED | KILLED
    job: Optional[int] = None
    sweep_id: Optional[str] = None
    overrides: list[str] = field(default_factory=list)
    run_id: Optional[str] = None
    run_name: Optional[str] = None
    accelerator: Optional[str] = None
    batch_size: Optional[int] = None
    it_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    val_rmse: Optional[float] = None
    val_rmse_baseline: Optional[float] = None
    best_val_rmse: Optional[float] = None  # the lowest val_rmse of the run (val_rmse is the final one)
    target_rmse: Optional[float] = None
    time_to_target_s: Optional[float] = None  # None with a target: never reached
    output_network: Optional[str] = None  # the network kept: last, or best (step N)
    model_uri: Optional[str] = None  # the network as an MLflow model (runs:/<id>/model or models:/NAME/VERSION)
    reason: Optional[str] = None

    def write(self, output_dir: Path) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / JOB_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> "JobResult":
        return cls(**json.loads(path.read_text()))


def job_key(overrides: list[str] | str) -> str:
    """What identifies a sweep's job across a resumption: its overrides, in any order, without
    `resume=` (which the resumed sweep adds to every job). Taken from the job's override list or
    from a run's `hydra_overrides` tag (the same list joined by spaces)."""
    text = overrides if isinstance(overrides, str) else " ".join(overrides)
    text = mask_text(text)  # the tag's copy is masked: compare like with like
    return " ".join(sorted(o for o in text.split() if not o.lstrip("+~").startswith("resume=")))
