"""Hydra callback for multiruns: one MLflow parent run per sweep with every job as its child,
and a one-screen summary at the end (exit status 1 if any job failed). Also how a sweep that was
cut short continues: `python train.py -m <the same overrides> resume=latest` (or resume=<sweep
id>) reopens its parent run, skips the jobs that FINISHED, continues KILLED ones from their
checkpoint into their own runs, and runs FAILED (or never started) ones again.

`resume` means one thing per mode: in a single run it names an MLflow run (resume=RUN_ID, a
32-digit hex id: seqlab.resume.interrupt); in a multirun it names a sweep, `latest` or the sweep id
printed at the sweep's end (its parent run's `sweep_id` tag)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig

from seqlab import SeqlabError, imports_without_gc
from seqlab.secrets import guard, mask_text, private
from seqlab.sweeps.job import PlannedJob, SweepInfo, is_run_id, job_key
from seqlab.sweeps.study import VERDICT_FILE
from seqlab.sweeps.summary import collect, format_summary, summary_csv

log = logging.getLogger("seqlab")


def _process_tags() -> dict[str, str]:
    """Which process runs the sweep: a resume can tell a sweep that died without ending its parent
    run (kill -9, a lost machine) from one that is still running."""

    return {"sweep_host": socket.gethostname(), "sweep_pid": str(os.getpid())}


def _plan_of(runs: list) -> dict[str, PlannedJob]:
    """A resumed sweep's plan from its runs (newest first: a job run again is planned from its
    newest run): per job, its run's id, status, whether it can continue from a checkpoint, and what
    the summary shows of it."""
    from seqlab.resume.points import STOPPED_AT  # a resumed sweep only

    plan: dict[str, PlannedJob] = {}
    for run in runs:
        t, m = run.data.tags, run.data.metrics
        if t.get("sweep_role") == "parent" or "hydra_overrides" not in t:
            continue
        key = job_key(t["hydra_overrides"])
        if key in plan:
            continue
        status = run.info.status
        # Still RUNNING after the store's reaper (seqlab.store.ghosts, when the store was opened):
        # its process lives here, or it runs elsewhere (a compute node) with a heartbeat that this
        # process has not seen stand still for long. Left alone, whatever host asks: never run twice.
        plan[key] = PlannedJob(
            run.info.run_id,
            run.info.run_name,
            status,
            resumable=status in ("KILLED", "FAILED") and STOPPED_AT in t,
            accelerator=t.get("accelerator"),
            batch_size=int(run.data.params["data.batch_size"])
            if run.data.params.get("data.batch_size", "").isdigit()
            else None,
            it_per_s=m.get("it_per_s_median"),
            val_rmse=m.get("final_val_rmse"),
            best_val_rmse=m.get("best_val_rmse"),
            host=t.get("process_host"),
        )
    return plan


def _alive(tags: dict[str, str]) -> bool:

    if tags.get("sweep_host") != socket.gethostname() or not tags.get("sweep_pid", "").isdigit():
        return False  # another machine's process cannot be checked from here: taken as gone
    try:
        os.kill(int(tags["sweep_pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return int(tags["sweep_pid"]) != os.getpid()


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun varies (`data.batch_size=32,64` -> data.batch_size)."""

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


# Launchers that run jobs side by side on this machine: they get the loopback server. (The
# basic launcher runs one job at a time; a cluster's jobs run on other hosts, which a loopback
# server cannot serve: they need a tracking server they reach, see docs/scaling.md.)
SWEEP_USER = "seqlab-sweep"  # the user a parallel sweep's own server signs its jobs in as
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
        self.resume_plan: Optional[dict[str, PlannedJob]] = (
            None  # a resumed sweep's jobs as they were
        )
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
        if (
            self.serve_local_store == "never"
            or launcher not in LOCAL_PARALLEL_LAUNCHERS
            or not store.startswith("sqlite:")
        ):
            return None
        from seqlab.store import (  # a parallel sweep's server only: every multirun loads this module
            server_auth,
        )
        from seqlab.store.server import LocalServer  # as server_auth

        self.tracker.connect()  # creates the store's tables and the experiment before any job runs
        # It signs its jobs in: a loopback port is open to every user of the machine, who could
        # otherwise read and write the sweep's runs. A password of this sweep's, in the server's and
        # the jobs' environment (the launcher's workers inherit this process's), never on a command line.
        password = secrets.token_urlsafe(24)
        auth_env = server_auth.auth_environment(
            "127.0.0.1",
            sweep_dir / "server-auth",
            want_auth=True,
            admin_username=SWEEP_USER,
            password=password,
        )
        os.environ[server_auth.USERNAME], os.environ[server_auth.PASSWORD] = SWEEP_USER, password
        # Started, not waited for: it comes up while the launcher starts its workers, and each
        # job waits for it. The parent run stays on the file: it writes only before the jobs
        # start and after they end.
        self.server = LocalServer(
            store,
            str(Path(self.tracker.artifact_root or sweep_dir / "artifacts").resolve()),
            log_path=sweep_dir / "mlflow_server.log",
            auth_env=auth_env,
        ).start(wait=False)
        print(
            f"parallel jobs log through {self.server.uri} (an MLflow server over {store}, stopped at the end)",
            flush=True,
        )
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

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        private(sweep_dir)  # its jobs' folders hold their resolved configs
        self.sweep_id = f"{sweep_dir.name}-{uuid.uuid4().hex[:6]}"
        self.sweep_dir = sweep_dir
        with imports_without_gc("seqlab.tracking.run"):  # MLflow loads here, for the parent run
            self.tracker = instantiate(config.logger)
        overrides = self.overrides = list(config.hydra.overrides.task)
        guard(
            overrides
        )  # credentials on the command line show as *** from here on (Hydra's job list too)
        parent = None
        if config.get("resume"):
            try:  # before anything starts: a sweep that cannot be continued changes nothing
                parent, self.resume_plan = self._plan_resume(str(config.resume), overrides)
            except SeqlabError as error:
                print(f"error: {error}", file=sys.stderr, flush=True)
                raise SystemExit(1) from None
        if "submitit" in config.hydra.launcher.get(
            "_target_", ""
        ) and not self.tracker.tracking_uri.startswith("http"):
            print(
                "note: cluster jobs share one store through a tracking server: "
                "make server on a host they reach, then logger=mlflow_server",
                flush=True,
            )
        # If the sweep never reaches on_multirun_end (a job's config does not compose, Ctrl-C),
        # the parent run must still not be left RUNNING, nor a server left behind.
        atexit.register(self._end_unfinished)
        jobs_uri = self._serve(config, sweep_dir)
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        if parent is None:
            run_id = self.tracker.start(
                f"sweep-{self.sweep_id}",
                # sweep_overrides: the command line as a list, for a later resume=... to compare with
                {
                    "sweep_id": self.sweep_id,
                    "sweep_role": "parent",
                    "hydra_overrides": " ".join(overrides),
                    "sweep_overrides": json.dumps(overrides),
                    **_process_tags(),
                },
            )
        else:
            run_id = self.tracker.start(
                parent.info.run_name,
                {
                    "sweep_resumes": int(parent.data.tags.get("sweep_resumes", 0)) + 1,
                    **_process_tags(),
                },
                resume_run_id=parent.info.run_id,
            )
        SweepInfo(
            sweep_id=self.sweep_id,
            parent_run_id=run_id,
            tracking_uri=jobs_uri or self.tracker.tracking_uri,
            store_uri=self.tracker.tracking_uri if jobs_uri else None,
            experiment_id=self.tracker.experiment_id,
            swept_keys=list(
                dict.fromkeys(
                    swept_keys(overrides) + list((config.hydra.sweeper.get("params") or {}).keys())
                )
            ),
            resume_plan=self.resume_plan,
            server_pid=self.server.proc.pid if self.server is not None else None,
        ).write(sweep_dir)

    def _plan_resume(self, value: str, overrides: list[str]) -> tuple[Any, dict[str, PlannedJob]]:
        """The sweep `value` names (latest, or a sweep id), checked against this command line, and
        the plan for its jobs: per job (its overrides, without resume=), its newest run's id,
        status, whether that run can continue from a checkpoint, and what the summary shows of it."""
        client = self.tracker.connect()
        experiment = self.tracker.experiment_name
        if is_run_id(value):
            raise SeqlabError(
                f"resume={value} names a run; a sweep continues with resume=latest or resume=<sweep id> "
                "(printed at the sweep's end); a single run with: python train.py <its overrides> resume=RUN_ID"
            )
        if not re.match(r"^[\w.:-]+$", value):  # it goes into a search filter
            raise SeqlabError(
                f"resume={value}: not a sweep id (latest, or the id printed at a sweep's end)"
            )
        query = "tags.sweep_role = 'parent'" + (
            "" if value == "latest" else f" and tags.sweep_id = '{value}'"
        )
        parents = client.search_runs(
            [self.tracker.experiment_id],
            query,
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not parents:
            what = "no sweep" if value == "latest" else f"no sweep {value!r}"
            raise SeqlabError(f"resume={value}: {what} in experiment {experiment!r} to continue")
        parent = parents[0]
        sweep_id = parent.data.tags["sweep_id"]
        if parent.info.status == "RUNNING" and _alive(parent.data.tags):
            raise SeqlabError(
                f"resume={value}: sweep {sweep_id} is still running (process {parent.data.tags['sweep_pid']} "
                "on this host); let it finish or stop it first"
            )
        tag = parent.data.tags.get("sweep_overrides")
        before = json.loads(tag) if tag else parent.data.tags.get("hydra_overrides", "").split()
        now_key, before_key = set(job_key(overrides).split()), set(job_key(before).split())
        if now_key != before_key:
            differ = [f"{o} (not in the sweep)" for o in sorted(now_key - before_key)]
            differ += [f"{o} (missing)" for o in sorted(before_key - now_key)]
            kept = [
                o for o in before if not o.lstrip("+~").startswith("resume=")
            ]  # in its order: it sets the jobs' order
            command = " ".join(["python train.py -m", *kept, f"resume={sweep_id}"])
            raise SeqlabError(
                f"resume={value}: these overrides differ from sweep {sweep_id}'s: {', '.join(differ)}; "
                f"continue it with: {command}"
            )
        runs = client.search_runs(
            [self.tracker.experiment_id],
            f"tags.sweep_id = '{sweep_id}'",
            order_by=["attributes.start_time DESC"],
            max_results=5000,
        )
        plan = _plan_of(runs)
        self.sweep_id = sweep_id
        counts = {
            s: sum(e.status == s for e in plan.values())
            for s in ("FINISHED", "KILLED", "FAILED", "RUNNING")
        }
        note = (
            " (its parent run was still RUNNING: the sweep was killed without ending it)"
            if parent.info.status == "RUNNING"
            else ""
        )
        print(
            f"resuming sweep {sweep_id} (parent run {parent.info.run_id}){note}: {counts['FINISHED']} job(s) FINISHED "
            f"before are skipped, {sum(e.resumable and e.status == 'KILLED' for e in plan.values())} KILLED continue from their checkpoint, "
            + (
                f"{counts['RUNNING']} still running (their heartbeat is alive) are left alone, "
                if counts["RUNNING"]
                else ""
            )
            + "the others run",
            flush=True,
        )
        return parent, plan

    def _exit_on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        raise SystemExit(128 + signum)

    def _end_unfinished(self) -> None:
        try:
            if self.tracker is not None and self.tracker.run_id:
                # A job interrupted in a launcher's worker says so in its result file.
                killed = self.interrupted or any(
                    r.status == "KILLED" for r in collect(self.sweep_dir, self.sweep_id)
                )
                status = "KILLED" if killed else "FAILED"
                self.tracker.end(status, "the sweep stopped before its summary: see the console")
                self.tracker.run_id = None
                kept = [o for o in self.overrides if not o.lstrip("+~").startswith("resume=")]
                if killed:  # a sweep that failed to start (a config that does not compose) has nothing to continue
                    print(
                        mask_text(
                            f"sweep {self.sweep_id} ended {status}; continue it (finished jobs are skipped) with:\n  "
                            + " ".join(["python train.py -m", *kept, f"resume={self.sweep_id}"])
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            self._stop_server()

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _compare(self, sweep_dir: Path) -> None:
        """The side-by-side comparison of the sweep's runs, stored on its parent run."""
        from seqlab.sweeps.compare import compare  # MLflow and matplotlib: at the sweep's end only

        try:
            report = compare(
                self.tracker.connect(),
                self.tracker.experiment_name,
                sweep_dir / "comparison",
                self.sweep_id,
            )
        except Exception as error:  # the summary and statuses matter more than the plots
            print(f"comparison skipped: {' '.join(str(error).split())}", flush=True)
            return
        print(f"\nverdict: {report.verdict}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # _end_unfinished stays registered until the parent run has ended: whatever fails on
        # the way still ends it and stops the sweep's server.
        sweep_dir = Path(config.hydra.sweep.dir)
        results = collect(sweep_dir, self.sweep_id)
        running = [
            r for r in results if r.status == "RUNNING"
        ]  # a resumed sweep's jobs that still train elsewhere
        failed = [r for r in results if r.status not in ("FINISHED", "RUNNING")]
        table = format_summary(results, self.resume_plan)
        header = f"sweep {self.sweep_id}{' (resumed)' if self.resume_plan is not None else ''}: {len(results)} jobs, {len(failed)} failed"
        if running:
            header += (
                f", {len(running)} still running elsewhere (left alone: resume again once they end)"
            )
        if self.tracker is not None and self.tracker.run_id:
            header += f"; MLflow parent run {self.tracker.run_id} in experiment '{self.tracker.experiment_name}'"
        print(
            mask_text(f"\n{header}\n{table}\noutputs in {sweep_dir}"), flush=True
        )  # the table quotes overrides
        if self.tracker is not None and self.tracker.run_id:
            self._compare(sweep_dir)
            search = (
                sweep_dir / VERDICT_FILE
            )  # hparams_search: written by seqlab.sweeps.search_report
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
