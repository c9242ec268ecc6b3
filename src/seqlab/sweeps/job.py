"""What a task knows about the Hydra job it runs in, and the small files that connect a
multirun's jobs to their sweep: `sweep.json` (`SweepInfo`, written once by the sweep callback) and
one `seqlab_job.json` per job (`JobResult`, written by the job, read back for the sweep summary).
Files, not in-memory state, so that launchers running jobs in other processes work the same way.
Also what `resume=` means to a job: a run id in a single run, the sweep's plan in a multirun."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from seqlab import SeqlabError
from seqlab.ddp.ranks import handed_pack, local_processes, process_rank
from seqlab.secrets import guard, mask_text, private
from seqlab.sweeps.trial import current
from seqlab.validation import validate

log = logging.getLogger("seqlab")

SWEEP_FILE = "sweep.json"
JOB_FILE = "seqlab_job.json"


def fmt(value: Any, spec: str = ".4g") -> str:
    """A number for a summary table or report line; "-" where there is none."""
    return "-" if value is None else format(value, spec)


def cpu_count() -> int:
    """The cores this process may use (a container or taskset may allow fewer than the machine has)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


@dataclass
class Job:
    output_dir: Path
    overrides: list[str] = field(default_factory=list)
    sweep_dir: Optional[Path] = None  # set in a multirun
    num: Optional[int] = None
    result: Optional["JobResult"] = None  # what this job has written so far
    rank: int = field(default_factory=process_rank)  # > 0: a helper process of a DDP job
    concurrent_jobs: int = 1  # jobs a parallel launcher runs at once on this machine
    member: Optional[int] = None  # a member of pack `num` (seqlab.packing): its place in the pack
    pack_id: Optional[str] = None

    def write(self, result: "JobResult") -> None:
        """The job's result file; only rank 0 speaks for the job."""
        result.member, result.pack_id = self.member, self.pack_id
        self.result = result
        if self.rank == 0:
            result.write(self.output_dir)

    def cpu_share(self, trainer_cfg: Any) -> Optional[int]:
        """The cores each of this job's processes takes while a parallel launcher runs others
        beside it, or while it trains as several DDP processes on this machine (None: one process
        alone, which takes torch's default, all of them). Lightning's launcher gives DDP
        processes this share too (cores / processes), but only as it starts training, after the
        runs' torch_threads tag is written."""
        processes = self.concurrent_jobs * local_processes(trainer_cfg)
        return max(1, cpu_count() // processes) if processes > 1 else None

    @property
    def multirun(self) -> bool:
        return self.sweep_dir is not None

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> "Job":
        """The current Hydra job; outside Hydra (tests, notebooks) a single run in
        cfg.paths.output_dir."""

        output_dir = Path(cfg.paths.output_dir)
        if not HydraConfig.initialized():
            return cls(output_dir)
        hc = HydraConfig.get()
        overrides = list(hc.overrides.task)
        if hc.mode == RunMode.MULTIRUN:
            job = cls(output_dir, overrides, Path(hc.sweep.dir), hc.job.num)
            if "joblib" in hc.launcher.get("_target_", ""):
                n_jobs = int(hc.launcher.get("n_jobs") or 1)
                job.concurrent_jobs = (
                    n_jobs if n_jobs > 0 else max(1, cpu_count() + 1 + n_jobs)
                )  # joblib's -1: all
            return job
        handed = handed_pack() if cfg.get("pack_job") is not None else None
        if handed is not None:  # a DDP pack's other process: its pack's job of the sweep
            return cls(output_dir, overrides, Path(handed["sweep_dir"]), handed["num"])
        return cls(output_dir, overrides)

    def sweep_info(self) -> "SweepInfo":
        """What the sweep callback wrote for this job's sweep; an empty SweepInfo outside a
        multirun or without the callback."""
        return SweepInfo.read(self.sweep_dir) if self.sweep_dir is not None else SweepInfo()


@dataclass
class PlannedJob:
    """A job of a resumed sweep as the sweep left it: its newest run, and what the summary shows of it."""

    run_id: str
    run_name: Optional[str]
    status: str  # FINISHED | KILLED | FAILED | RUNNING (alive elsewhere: left alone)
    resumable: bool  # a checkpoint to continue from (KILLED; or FAILED in a pack that was stopped, see continue_job)
    accelerator: Optional[str] = None
    batch_size: Optional[int] = None
    it_per_s: Optional[float] = None
    val_rmse: Optional[float] = None
    best_val_rmse: Optional[float] = None
    host: Optional[str] = None  # where its process runs (process_host)


@dataclass
class SweepInfo:
    """`sweep.json`: written once by the sweep callback (seqlab.sweeps.callback) when a multirun
    starts, read by its jobs and by a search. One definition for writer and readers, so a renamed
    field fails where it is read instead of reading as None."""

    sweep_id: Optional[str] = None
    parent_run_id: Optional[str] = None
    tracking_uri: Optional[str] = (
        None  # where the jobs log: the store, or the sweep's own server over it
    )
    store_uri: Optional[str] = None  # the local store behind that server (None: no server)
    experiment_id: Optional[str] = None
    swept_keys: Optional[list[str]] = None  # swept on the command line or by hydra.sweeper.params
    resume_plan: Optional[dict[str, PlannedJob]] = (
        None  # a resumed sweep: each job (job_key) as it was before
    )
    server_pid: Optional[int] = (
        None  # the sweep's own server's process (the jobs check that it is what answers)
    )

    def write(self, sweep_dir: Path) -> None:
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, sweep_dir: Path) -> "SweepInfo":
        path = sweep_dir / SWEEP_FILE
        if not path.is_file():
            return cls()
        info = cls(**json.loads(path.read_text()))
        if info.resume_plan is not None:
            info.resume_plan = {key: PlannedJob(**entry) for key, entry in info.resume_plan.items()}
        return info

    def routed(self, uri: str) -> str:
        """A job of a parallel sweep whose runs go to a local SQLite store logs through the
        loopback server the sweep started over that store (store_uri -> tracking_uri)."""
        if self.store_uri and self.store_uri == uri:
            return self.tracking_uri
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
    best_val_rmse: Optional[float] = (
        None  # the lowest val_rmse of the run (val_rmse is the final one)
    )
    target_rmse: Optional[float] = None
    time_to_target_s: Optional[float] = None  # None with a target: never reached
    output_network: Optional[str] = None  # the network kept: last, or best (step N)
    model_uri: Optional[str] = (
        None  # the network as an MLflow model (runs:/<id>/model or models:/NAME/VERSION)
    )
    reason: Optional[str] = None
    member: Optional[int] = None  # a packed job's place in its pack (job: the pack's job number)
    pack_id: Optional[str] = None

    def write(self, output_dir: Path) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / JOB_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> "JobResult":
        return cls(**json.loads(path.read_text()))

    @classmethod
    def read_if_any(cls, output_dir: Path) -> Optional["JobResult"]:
        """What an earlier start of this job wrote in its folder (None: this is its first)."""
        try:
            return cls.read(output_dir / JOB_FILE)
        except (OSError, ValueError, TypeError):
            return None


def job_key(overrides: list[str] | str) -> str:
    """What identifies a sweep's job across a resumption: its overrides, in any order, without
    `resume=` (which the resumed sweep adds to every job). Taken from the job's override list or
    from a run's `hydra_overrides` tag (the same list joined by spaces)."""
    text = overrides if isinstance(overrides, str) else " ".join(overrides)
    text = mask_text(text)  # the tag's copy is masked: compare like with like
    return " ".join(sorted(o for o in text.split() if not o.lstrip("+~").startswith("resume=")))


# MLflow run ids are 32 hex digits; sweep ids are the sweep folder's name and 6 hex digits.
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def is_run_id(value: str) -> bool:
    return bool(_RUN_ID.match(str(value)))


def check_single_run_resume(value: str) -> None:
    """A single run continues a run; `latest` or a sweep id belongs to a multirun."""
    if not is_run_id(value):
        raise SeqlabError(
            f"resume={value}: a single run continues an MLflow run (resume=RUN_ID, 32 hex digits); "
            f"to continue a sweep, run it again with -m, its overrides and resume={value}"
        )


def continue_job(cfg: DictConfig, job: Job) -> Optional[JobResult]:
    """What this job of a resumed sweep does, from the plan the sweep callback wrote in
    sweep.json: a job that FINISHED before is skipped (its result is returned, pointing at its
    run); a KILLED one with a checkpoint continues that run (cfg.resume becomes its run id);
    anything else runs anew (cfg.resume is cleared). Returns None when the job is to train."""
    info = job.sweep_info()
    entry = planned(cfg, job)
    cfg.resume = None
    # From here on the job's overrides say what it does: a DDP job starts its other processes as
    # single runs with them (ranks.start_ranks_as_this_job), where resume= must name the run.
    job.overrides = [o for o in job.overrides if not o.lstrip("+~").startswith("resume=")]
    if entry is None:
        return None  # the sweep had not got to this job
    if entry.status in ("FINISHED", "RUNNING"):
        return _left_as_it_is(job, entry, info.sweep_id)
    if entry.status == "KILLED" and entry.resumable:
        cfg.resume = entry.run_id
        job.overrides.append(f"resume={cfg.resume}")
        log.info(
            "resume    job %s continues its KILLED run %s (%s) from its checkpoint",
            job.num,
            entry.run_name,
            entry.run_id,
        )
    elif entry.status == "FAILED" and entry.resumable and job.member is not None:
        # A pack's member that failed (its loss diverged) before the pack was stopped: the pack's
        # checkpoint holds it, FAILED. It keeps its slot as the pack continues and is not trained
        # again: its run stays the FAILED run it is (seqlab.train).
        cfg.resume = entry.run_id
        log.info(
            "failed    job %s (member %s) FAILED in its pack before the stop, in run %s (%s): it stays FAILED",
            job.num,
            job.member,
            entry.run_name,
            entry.run_id,
        )
    else:
        log.info(
            "rerun     job %s: its run %s ended %s%s; it runs again",
            job.num,
            entry.run_id,
            entry.status,
            " without a checkpoint" if entry.status == "KILLED" else "",
        )
    return None


def _left_as_it_is(job: Job, entry: PlannedJob, sweep_id: Optional[str]) -> JobResult:
    """A job the resumed sweep does not train: FINISHED before (skipped, its result pointing at its
    run) or still RUNNING on another host, its heartbeat alive (left alone). Its result, written."""
    if entry.status == "FINISHED":
        result = JobResult(
            "FINISHED",
            job.num,
            sweep_id,
            job.overrides,
            run_id=entry.run_id,
            run_name=entry.run_name,
            accelerator=entry.accelerator,
            batch_size=entry.batch_size,
            it_per_s=entry.it_per_s,
            val_rmse=entry.val_rmse,
            best_val_rmse=entry.best_val_rmse,
        )
        log.info(
            "done      job %s FINISHED before, in run %s (%s): skipped",
            job.num,
            entry.run_name,
            entry.run_id,
        )
    else:
        result = JobResult(
            "RUNNING",
            job.num,
            sweep_id,
            job.overrides,
            run_id=entry.run_id,
            run_name=entry.run_name,
            reason=f"still running on {entry.host or 'another host'}: left alone",
        )
        log.info(
            "running   job %s still trains in run %s (%s) on %s, its heartbeat alive: left alone",
            job.num,
            entry.run_name,
            entry.run_id,
            entry.host or "another host",
        )
    job.write(result)
    return result


def planned(cfg: DictConfig, job: Job) -> Optional[PlannedJob]:
    """This job as the resumed sweep left it (None: the sweep had not got to it)."""
    plan = job.sweep_info().resume_plan
    if plan is None:  # a launcher or config without the sweep callback
        raise SeqlabError(
            f"resume={cfg.resume}: continuing a sweep needs the sweep callback (hydra.callbacks.mlflow_sweep)"
        )
    return plan.get(job_key(job.overrides))


def resume_command(overrides: list[str], run_id: str) -> str:
    """The command that continues a single run stopped with a checkpoint."""
    if (
        current() is not None
    ):  # a search's trial is not resumed on its own: the search runs its values again
        return "the search's own command again (python train.py -m hparams_search=...): it runs this trial's values anew"
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("resume=", "ckpt_path="))]
    return " ".join(["python train.py", *kept, f"resume={run_id}"])


def ready(cfg: DictConfig, job: Job) -> Optional[JobResult]:
    """What a job does before anything heavy loads (light: a resumed sweep's finished job is skipped
    without importing torch): the config checked, its credentials masked from here on in the console
    and train.log, its folder the user's only, and a resume's plan read. Returns the result of a job
    that plan says is done already (None: train it)."""
    validate(cfg)
    guard(cfg)
    if job.output_dir.is_dir():
        private(job.output_dir)
    if cfg.resume:
        if job.multirun:  # resume=latest|<sweep id>: the sweep's plan says what this job does
            return continue_job(cfg, job)
        check_single_run_resume(cfg.resume)
    return None
