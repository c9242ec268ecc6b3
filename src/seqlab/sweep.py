"""Hydra callback for multiruns: one MLflow parent run per sweep with every job as its child,
and a one-screen summary at the end (exit status 1 if any job failed). Also how a sweep that was
cut short continues: `python train.py -m <the same overrides> resume=latest` (or resume=<sweep
id>) reopens its parent run, skips the jobs that FINISHED, continues KILLED ones from their
checkpoint into their own runs, and runs FAILED (or never started) ones again.

`resume` means one thing per mode: in a single run it names an MLflow run (resume=RUN_ID, a
32-digit hex id: seqlab.interrupt); in a multirun it names a sweep, `latest` or the sweep id
printed at the sweep's end (its parent run's `sweep_id` tag)."""

from __future__ import annotations

import atexit
import logging
import csv
import io
import json
import os
import re
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from seqlab import SeqlabError
from seqlab.job import JOB_FILE, SWEEP_FILE, Job, JobResult, fmt, job_key
from seqlab.secrets import guard, mask_text


log = logging.getLogger("seqlab")

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


def _process_tags() -> dict[str, str]:
    """Which process runs the sweep: a resume can tell a sweep that died without ending its parent
    run (kill -9, a lost machine) from one that is still running."""
    import socket

    return {"sweep_host": socket.gethostname(), "sweep_pid": str(os.getpid())}


def _alive(tags: dict[str, str]) -> bool:
    import socket

    if tags.get("sweep_host") != socket.gethostname() or not tags.get("sweep_pid", "").isdigit():
        return False  # another machine's process cannot be checked from here: taken as gone
    try:
        os.kill(int(tags["sweep_pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return int(tags["sweep_pid"]) != os.getpid()


def continue_job(cfg: DictConfig, job: Job) -> Optional[JobResult]:
    """What this job of a resumed sweep does, from the plan the sweep callback wrote in
    sweep.json: a job that FINISHED before is skipped (its result is returned, pointing at its
    run); a KILLED one with a checkpoint continues that run (cfg.resume becomes its run id);
    anything else runs anew (cfg.resume is cleared). Returns None when the job is to train."""
    info = job.sweep_info()
    plan = info.get("resume_plan")
    if plan is None:  # a launcher or config without the sweep callback
        raise SeqlabError(f"resume={cfg.resume}: continuing a sweep needs the sweep callback (hydra.callbacks.mlflow_sweep)")
    entry = plan.get(job_key(job.overrides))
    cfg.resume = None
    # From here on the job's overrides say what it does: a DDP job starts its other processes as
    # single runs with them (ranks.start_ranks_as_this_job), where resume= must name the run.
    job.overrides = [o for o in job.overrides if not o.lstrip("+~").startswith("resume=")]
    if entry is None:
        return None  # the sweep had not got to this job
    if entry["status"] == "FINISHED":
        result = JobResult(
            "FINISHED", job.num, info.get("sweep_id"), job.overrides, run_id=entry["run_id"],
            run_name=entry["run_name"], accelerator=entry.get("accelerator"), batch_size=entry.get("batch_size"),
            it_per_s=entry.get("it_per_s"), val_rmse=entry.get("val_rmse"), best_val_rmse=entry.get("best_val_rmse"),
        )
        job.write(result)
        log.info("done      job %s FINISHED before, in run %s (%s): skipped", job.num, entry["run_name"], entry["run_id"])
        return result
    if entry["status"] == "KILLED" and entry["resumable"]:
        cfg.resume = entry["run_id"]
        job.overrides.append(f"resume={cfg.resume}")
        log.info("resume    job %s continues its KILLED run %s (%s) from its checkpoint", job.num, entry["run_name"], entry["run_id"])
    else:
        log.info("rerun     job %s: its run %s ended %s%s; it runs again", job.num, entry["run_id"], entry["status"],
                 " without a checkpoint" if entry["status"] == "KILLED" else "")
    return None


def collect(sweep_dir: Path, sweep_id: str | None = None) -> list[JobResult]:
    """Every job of the sweep that got as far as writing its result file, in job order (files
    of another sweep that used the same folder are left out)."""
    results = [JobResult.read(p) for p in sweep_dir.glob(f"**/{JOB_FILE}")]
    results = [r for r in results if sweep_id is None or r.sweep_id == sweep_id]
    return sorted(results, key=lambda r: (r.job is None, r.job))


def _status(result: JobResult, plan: Optional[dict[str, Any]]) -> str:
    """The job's status; in a resumed sweep, also whether it was done before or continued."""
    before = (plan or {}).get(job_key(result.overrides))
    if before is None or before["run_id"] != result.run_id:
        return result.status
    if before["status"] == "FINISHED":
        return "FINISHED (done before: skipped)"
    return f"{result.status} (continued)"


def summary_rows(results: list[JobResult], plan: Optional[dict[str, Any]] = None) -> list[dict[str, str]]:
    return [
        {
            "job": fmt(r.job, "d"),
            "overrides": " ".join(o for o in r.overrides if not o.startswith("resume=")) or "(defaults)",
            "status": _status(r, plan),
            "it/s": fmt(r.it_per_s, ",.0f"),
            "val_rmse": fmt(r.val_rmse, ".4g"),
            "best": fmt(r.best_val_rmse, ".4g"),  # the lowest val_rmse of the run
            "run": r.run_name or "-",
        }
        for r in results
    ]


def format_summary(results: list[JobResult], plan: Optional[dict[str, Any]] = None) -> str:
    rows = summary_rows(results, plan)
    if not rows:
        return "no job results found"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in columns) for row in rows]
    lines += [f"job {r.job}: {r.reason}" for r in results if r.reason]
    return "\n".join(lines)


def summary_csv(results: list[JobResult], plan: Optional[dict[str, Any]] = None) -> str:
    rows = summary_rows(results, plan)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*rows[0], "reason"] if rows else ["job"])
    writer.writeheader()
    for row, result in zip(rows, results):
        writer.writerow({**row, "reason": result.reason or ""})
    return out.getvalue()


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun varies (`data.batch_size=32,64` -> data.batch_size)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


# Launchers that run jobs side by side on this machine: they get the loopback server. (The
# basic launcher runs one job at a time; a cluster's jobs run on other hosts, which a loopback
# server cannot serve: they need a tracking server they reach, see README "Scaling out".)
LOCAL_PARALLEL_LAUNCHERS = (
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
)


class MlflowSweepCallback(Callback):
    """Configured in conf/hydra/default.yaml. MLflow is imported only when a sweep starts.

    `serve_local_store`: when a launcher runs jobs at the same time (hydra/launcher=joblib) and
    the runs go to the local SQLite store, the sweep starts an MLflow server on a loopback port
    over that store for its duration and routes every job through it ('auto'; 'never' to write
    to the file directly). SQLite takes one writer at a time, and MLflow processes that open a
    store at the same moment race each other's table set-up (of 8 opening a new store at once, 7
    failed here); one server process owns the file and serialises the writes, and the jobs are
    plain HTTP clients that retry. A sweep on a tracking server already has one."""

    def __init__(self, serve_local_store: str = "auto") -> None:
        if serve_local_store not in ("auto", "never"):
            raise ValueError(f"serve_local_store must be auto or never, got {serve_local_store!r}")
        self.serve_local_store = serve_local_store
        self.tracker = None
        self.interrupted = False  # a signal ended the sweep (jobs say so in their result files)
        self.sweep_id = None
        self.sweep_dir: Optional[Path] = None
        self.server = None
        self.resume_plan: Optional[dict[str, Any]] = None  # a resumed sweep's jobs as they were
        self.overrides: list[str] = []  # the sweep's command line

    def __getstate__(self) -> dict[str, Any]:
        # Parallel launchers send the callbacks to their workers, which use none of this state
        # (and a server process handle does not pickle).
        return {**self.__dict__, "tracker": None, "server": None}

    def _serve(self, config: DictConfig, sweep_dir: Path) -> Optional[str]:
        """Start the loopback server over the local store if this sweep needs one; return its
        address for the jobs (None: they write to the store themselves)."""
        launcher = config.hydra.launcher.get("_target_", "")
        store = self.tracker.tracking_uri
        if self.serve_local_store == "never" or launcher not in LOCAL_PARALLEL_LAUNCHERS or not store.startswith("sqlite:"):
            return None
        from seqlab.server import LocalServer

        self.tracker.connect()  # creates the store's tables and the experiment before any job runs
        # Started, not waited for: it comes up while the launcher starts its workers, and each
        # job waits for it. The parent run stays on the file: it writes only before the jobs
        # start and after they end.
        self.server = LocalServer(
            store, str(Path(self.tracker.artifact_root or sweep_dir / "artifacts").resolve()),
            log_path=sweep_dir / "mlflow_server.log",
        ).start(wait=False)
        print(f"parallel jobs log through {self.server.uri} (an MLflow server over {store}, stopped at the end)", flush=True)
        # This process only waits for the workers: a SIGTERM or SIGHUP (scancel, a closed
        # terminal) ends it through SystemExit, so that atexit ends the parent run and the server.
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, self._exit_on_signal)
        # MLflow prints a "View run at <server>" link per run over http; this server's address
        # is gone after the sweep (make ui shows the runs). The jobs inherit the setting.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        return self.server.uri

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.sweep_id = f"{sweep_dir.name}-{uuid.uuid4().hex[:6]}"
        self.sweep_dir = sweep_dir
        self.tracker = instantiate(config.logger)
        overrides = self.overrides = list(config.hydra.overrides.task)
        guard(overrides)  # credentials on the command line show as *** from here on (Hydra's job list too)
        resumed = None
        if config.get("resume"):
            try:  # before anything starts: a sweep that cannot be continued changes nothing
                resumed = self._plan_resume(str(config.resume), overrides)
            except SeqlabError as error:
                print(f"error: {error}", file=sys.stderr, flush=True)
                raise SystemExit(1) from None
        if "submitit" in config.hydra.launcher.get("_target_", "") and not self.tracker.tracking_uri.startswith("http"):
            print("note: cluster jobs share one store through a tracking server: "
                  "make server on a host they reach, then logger=mlflow_server", flush=True)
        # If the sweep never reaches on_multirun_end (a job's config does not compose, Ctrl-C),
        # the parent run must still not be left RUNNING, nor a server left behind.
        atexit.register(self._end_unfinished)
        jobs_uri = self._serve(config, sweep_dir)
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        if resumed is None:
            run_id = self.tracker.start(
                f"sweep-{self.sweep_id}",
                # sweep_overrides: the command line as a list, for a later resume=... to compare with
                {"sweep_id": self.sweep_id, "sweep_role": "parent", "hydra_overrides": " ".join(overrides),
                 "sweep_overrides": json.dumps(overrides), **_process_tags()},
            )
        else:
            parent = resumed["parent"]
            self.resume_plan = resumed["plan"]
            run_id = self.tracker.start(parent.info.run_name, {"sweep_resumes": int(parent.data.tags.get("sweep_resumes", 0)) + 1,
                                                               **_process_tags()},
                                        resume_run_id=parent.info.run_id)
        (sweep_dir / SWEEP_FILE).write_text(
            json.dumps(
                {
                    "sweep_id": self.sweep_id,
                    "parent_run_id": run_id,
                    # Where the jobs log: the store, or the sweep's own server over it (store_uri).
                    "tracking_uri": jobs_uri or self.tracker.tracking_uri,
                    "store_uri": self.tracker.tracking_uri if jobs_uri else None,
                    "experiment_id": self.tracker.experiment_id,
                    # Swept on the command line or by a sweep preset (hydra.sweeper.params).
                    "swept_keys": swept_keys(overrides)
                    + list((config.hydra.sweeper.get("params") or {}).keys()),
                    # A resumed sweep: what each job of the sweep did before (continue_job reads it).
                    **({"resume_plan": resumed["plan"]} if resumed else {}),
                },
                indent=2,
            )
        )

    def _plan_resume(self, value: str, overrides: list[str]) -> dict[str, Any]:
        """The sweep `value` names (latest, or a sweep id), checked against this command line, and
        the plan for its jobs: per job (its overrides, without resume=), its newest run's id,
        status, whether that run can continue from a checkpoint, and what the summary shows of it."""
        from seqlab.interrupt import STOPPED_AT

        client = self.tracker.connect()
        experiment = self.tracker.experiment_name
        if is_run_id(value):
            raise SeqlabError(
                f"resume={value} names a run; a sweep continues with resume=latest or resume=<sweep id> "
                "(printed at the sweep's end); a single run with: python train.py <its overrides> resume=RUN_ID"
            )
        if not re.match(r"^[\w.:-]+$", value):  # it goes into a search filter
            raise SeqlabError(f"resume={value}: not a sweep id (latest, or the id printed at a sweep's end)")
        query = "tags.sweep_role = 'parent'" + ("" if value == "latest" else f" and tags.sweep_id = '{value}'")
        parents = client.search_runs([self.tracker.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
        if not parents:
            what = "no sweep" if value == "latest" else f"no sweep {value!r}"
            raise SeqlabError(f"resume={value}: {what} in experiment {experiment!r} to continue")
        parent = parents[0]
        sweep_id = parent.data.tags["sweep_id"]
        if parent.info.status == "RUNNING" and _alive(parent.data.tags):
            raise SeqlabError(f"resume={value}: sweep {sweep_id} is still running (process {parent.data.tags['sweep_pid']} "
                              "on this host); let it finish or stop it first")
        tag = parent.data.tags.get("sweep_overrides")
        before = json.loads(tag) if tag else parent.data.tags.get("hydra_overrides", "").split()
        now_key, before_key = set(job_key(overrides).split()), set(job_key(before).split())
        if now_key != before_key:
            differ = [f"{o} (not in the sweep)" for o in sorted(now_key - before_key)]
            differ += [f"{o} (missing)" for o in sorted(before_key - now_key)]
            kept = [o for o in before if not o.lstrip("+~").startswith("resume=")]  # in its order: it sets the jobs' order
            command = " ".join(["python train.py -m", *kept, f"resume={sweep_id}"])
            raise SeqlabError(f"resume={value}: these overrides differ from sweep {sweep_id}'s: {', '.join(differ)}; "
                              f"continue it with: {command}")
        runs = client.search_runs([self.tracker.experiment_id], f"tags.sweep_id = '{sweep_id}'",
                                  order_by=["attributes.start_time DESC"], max_results=5000)
        plan: dict[str, dict[str, Any]] = {}
        for run in runs:  # newest first: a job run again is planned from its newest run
            t, m = run.data.tags, run.data.metrics
            if t.get("sweep_role") == "parent" or "hydra_overrides" not in t:
                continue
            key = job_key(t["hydra_overrides"])
            if key in plan:
                continue
            status = run.info.status
            if status == "RUNNING":
                # The sweep that ran it is gone (kill -9, a lost machine): end it, and run the job again.
                client.set_tag(run.info.run_id, "failure_reason", "its sweep stopped without ending it; the resumed sweep runs it again")
                client.set_terminated(run.info.run_id, "KILLED")
                status = "KILLED"
            plan[key] = {
                "run_id": run.info.run_id, "run_name": run.info.run_name, "status": status,
                "resumable": status == "KILLED" and STOPPED_AT in t,
                "accelerator": t.get("accelerator"), "batch_size": int(run.data.params["data.batch_size"])
                if run.data.params.get("data.batch_size", "").isdigit() else None,
                "it_per_s": m.get("it_per_s_median"), "val_rmse": m.get("final_val_rmse"),
                "best_val_rmse": m.get("best_val_rmse"),
            }
        self.sweep_id = sweep_id
        counts = {s: sum(e["status"] == s for e in plan.values()) for s in ("FINISHED", "KILLED", "FAILED")}
        note = " (its parent run was still RUNNING: the sweep was killed without ending it)" if parent.info.status == "RUNNING" else ""
        print(f"resuming sweep {sweep_id} (parent run {parent.info.run_id}){note}: {counts['FINISHED']} job(s) FINISHED "
              f"before are skipped, {sum(e['resumable'] for e in plan.values())} KILLED continue from their checkpoint, "
              "the others run", flush=True)
        return {"parent": parent, "plan": plan}

    def _exit_on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        raise SystemExit(128 + signum)

    def _end_unfinished(self) -> None:
        try:
            if self.tracker is not None and self.tracker.run_id:
                # A job interrupted in a launcher's worker says so in its result file.
                killed = self.interrupted or any(r.status == "KILLED" for r in collect(self.sweep_dir, self.sweep_id))
                status = "KILLED" if killed else "FAILED"
                self.tracker.end(status, "the sweep stopped before its summary: see the console")
                self.tracker.run_id = None
                kept = [o for o in self.overrides if not o.lstrip("+~").startswith("resume=")]
                if killed:  # a sweep that failed to start (a config that does not compose) has nothing to continue
                    print(mask_text(f"sweep {self.sweep_id} ended {status}; continue it (finished jobs are skipped) with:\n  "
                          + " ".join(["python train.py -m", *kept, f"resume={self.sweep_id}"])), file=sys.stderr, flush=True)
        finally:
            self._stop_server()

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _compare(self, sweep_dir: Path) -> None:
        """The side-by-side comparison of the sweep's runs, stored on its parent run."""
        from seqlab.compare import compare

        try:
            report = compare(self.tracker.connect(), self.tracker.experiment_name, sweep_dir / "comparison", self.sweep_id)
        except Exception as error:  # the summary and statuses matter more than the plots
            print(f"comparison skipped: {' '.join(str(error).split())}", flush=True)
            return
        print(f"\nverdict: {report.verdict}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # _end_unfinished stays registered until the parent run has ended: whatever fails on
        # the way still ends it and stops the sweep's server.
        sweep_dir = Path(config.hydra.sweep.dir)
        results = collect(sweep_dir, self.sweep_id)
        failed = [r for r in results if r.status != "FINISHED"]
        table = format_summary(results, self.resume_plan)
        header = f"sweep {self.sweep_id}{' (resumed)' if self.resume_plan is not None else ''}: {len(results)} jobs, {len(failed)} failed"
        if self.tracker is not None and self.tracker.run_id:
            header += f"; MLflow parent run {self.tracker.run_id} in experiment '{self.tracker.experiment_name}'"
        print(mask_text(f"\n{header}\n{table}\noutputs in {sweep_dir}"), flush=True)  # the table quotes overrides
        if self.tracker is not None and self.tracker.run_id:
            self._compare(sweep_dir)
            search = sweep_dir / "search_verdict.txt"  # hparams_search: written by seqlab.search
            if search.is_file():
                print(f"\n{search.read_text().rstrip()}", flush=True)
            (sweep_dir / "sweep_summary.txt").write_text(f"{header}\n{table}\n")
            (sweep_dir / "sweep_summary.csv").write_text(summary_csv(results, self.resume_plan))
            self.tracker.log_artifact(sweep_dir / "sweep_summary.txt")
            self.tracker.log_artifact(sweep_dir / "sweep_summary.csv")
            self.tracker.set_tags({"n_jobs": len(results), "n_failed": len(failed)})
            self.tracker.end("FAILED" if failed else "FINISHED")
            self.tracker.run_id = None
        self._stop_server()
        atexit.unregister(self._end_unfinished)
        if failed:
            raise SystemExit(1)
