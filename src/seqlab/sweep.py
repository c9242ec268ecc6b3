"""Hydra callback for multiruns: one MLflow parent run per sweep with every job as its child,
and a one-screen summary at the end (exit status 1 if any job failed)."""

from __future__ import annotations

import atexit
import logging
import csv
import io
import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from seqlab.job import JOB_FILE, SWEEP_FILE, JobResult, fmt


# Set by a job that was interrupted, so that a sweep cut short ends its parent run KILLED.
interrupted = False


def collect(sweep_dir: Path, sweep_id: str | None = None) -> list[JobResult]:
    """Every job of the sweep that got as far as writing its result file, in job order (files
    of another sweep that used the same folder are left out)."""
    results = [JobResult.read(p) for p in sweep_dir.glob(f"**/{JOB_FILE}")]
    results = [r for r in results if sweep_id is None or r.sweep_id == sweep_id]
    return sorted(results, key=lambda r: (r.job is None, r.job))


def summary_rows(results: list[JobResult]) -> list[dict[str, str]]:
    return [
        {
            "job": fmt(r.job, "d"),
            "overrides": " ".join(r.overrides) or "(defaults)",
            "status": r.status,
            "it/s": fmt(r.it_per_s, ",.0f"),
            "val_rmse": fmt(r.val_rmse, ".4g"),
            "run": r.run_name or "-",
        }
        for r in results
    ]


def format_summary(results: list[JobResult]) -> str:
    rows = summary_rows(results)
    if not rows:
        return "no job results found"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in columns) for row in rows]
    lines += [f"job {r.job}: {r.reason}" for r in results if r.reason]
    return "\n".join(lines)


def summary_csv(results: list[JobResult]) -> str:
    rows = summary_rows(results)
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


def _exit_on_signal(signum: int, frame: Any) -> None:
    global interrupted
    interrupted = True
    raise SystemExit(128 + signum)


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
        self.sweep_id = None
        self.sweep_dir: Optional[Path] = None
        self.server = None

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
                signal.signal(signum, _exit_on_signal)
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
        if "submitit" in config.hydra.launcher.get("_target_", "") and not self.tracker.tracking_uri.startswith("http"):
            print("note: cluster jobs share one store through a tracking server: "
                  "make server on a host they reach, then logger=mlflow_server", flush=True)
        # If the sweep never reaches on_multirun_end (a job's config does not compose, Ctrl-C),
        # the parent run must still not be left RUNNING, nor a server left behind.
        atexit.register(self._end_unfinished)
        jobs_uri = self._serve(config, sweep_dir)
        overrides = " ".join(config.hydra.overrides.task)
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        run_id = self.tracker.start(
            f"sweep-{self.sweep_id}",
            {"sweep_id": self.sweep_id, "sweep_role": "parent", "hydra_overrides": overrides},
        )
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
                    "swept_keys": swept_keys(list(config.hydra.overrides.task))
                    + list((config.hydra.sweeper.get("params") or {}).keys()),
                },
                indent=2,
            )
        )

    def _end_unfinished(self) -> None:
        try:
            if self.tracker is not None and self.tracker.run_id:
                # A job interrupted in a launcher's worker says so in its result file.
                killed = interrupted or any(r.status == "KILLED" for r in collect(self.sweep_dir, self.sweep_id))
                status = "KILLED" if killed else "FAILED"
                self.tracker.end(status, "the sweep stopped before its summary: see the console")
                self.tracker.run_id = None
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
        table = format_summary(results)
        header = f"sweep {self.sweep_id}: {len(results)} jobs, {len(failed)} failed"
        if self.tracker is not None and self.tracker.run_id:
            header += f"; MLflow parent run {self.tracker.run_id} in experiment '{self.tracker.experiment_name}'"
        print(f"\n{header}\n{table}\noutputs in {sweep_dir}", flush=True)
        if self.tracker is not None and self.tracker.run_id:
            self._compare(sweep_dir)
            search = sweep_dir / "search_verdict.txt"  # hparams_search: written by seqlab.search
            if search.is_file():
                print(f"\n{search.read_text().rstrip()}", flush=True)
            (sweep_dir / "sweep_summary.txt").write_text(f"{header}\n{table}\n")
            (sweep_dir / "sweep_summary.csv").write_text(summary_csv(results))
            self.tracker.log_artifact(sweep_dir / "sweep_summary.txt")
            self.tracker.log_artifact(sweep_dir / "sweep_summary.csv")
            self.tracker.set_tags({"n_jobs": len(results), "n_failed": len(failed)})
            self.tracker.end("FAILED" if failed else "FINISHED")
            self.tracker.run_id = None
        self._stop_server()
        atexit.unregister(self._end_unfinished)
        if failed:
            raise SystemExit(1)
