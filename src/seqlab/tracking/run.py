"""The run's lifecycle: one MLflow run per job, its params (the whole resolved config), tags,
metrics and artifacts, and its final status. `MlflowTracker.run` owns the lifecycle, so a run
is never left RUNNING, whatever ends the job. How the records travel is the sender's business
(tracking.senders)."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional
from urllib.parse import unquote, urlparse

import mlflow
from mlflow.entities import Metric, Param, RunTag
from omegaconf import DictConfig, OmegaConf

from seqlab import SeqlabError, ending_status, one_line
from seqlab.delivery.figures import Curves
from seqlab.delivery.journal import MetricJournal
from seqlab.schema import LoggerConfig as _Defaults
from seqlab.secrets import mask_flat, mask_text, mask_uris
from seqlab.store.ghosts import PID, end_dead_runs
from seqlab.store.local import is_database
from seqlab.store.server_auth import client_credentials
from seqlab.tracking.connect import artifact_location, client_for, ensure_experiment, is_server
from seqlab.tracking.costs import Costs
from seqlab.tracking.history import MetricHistory
from seqlab.tracking.replayed_steps import logged_through, not_yet_logged
from seqlab.tracking.senders import JournalSender, NullSender
from seqlab.tracking.system_metrics import listen

log = logging.getLogger("seqlab")


def flatten(cfg: DictConfig | Mapping, prefix: str = "") -> dict[str, str]:
    """{'data': {'batch_size': 64}} -> {'data.batch_size': '64'}; lists stay one value."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    flat: dict[str, str] = {}
    for key, value in container.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


# How long a checkpoint waits for the metrics before it (sync_metrics): the delivery process usually
# needs a fraction of a second; one that confirms nothing for longer is replaced by this process's
# own writes (a local store; a server's backlog goes with the checkpoint instead).
SYNC_WAIT_S = 30.0


class MlflowTracker:
    """Built from conf/logger/ (the defaults are the schema's, seqlab.schema.LoggerConfig).
    `run()` opens a run; everything else logs to it. `rank` > 0 (a DDP job's other processes):
    the same code runs and keeps its history, and nothing is sent."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str = _Defaults.experiment_name,
        artifact_root: Optional[str] = _Defaults.artifact_root,
        run_name: Optional[str] = _Defaults.run_name,
        flush_every_n_steps: int = _Defaults.flush_every_n_steps,
        flush_every_s: float = _Defaults.flush_every_s,
        log_checkpoint: bool = _Defaults.log_checkpoint,
        log_checkpoints: str = _Defaults.log_checkpoints,
        synchronous: bool = _Defaults.synchronous,
        system_metrics: bool = _Defaults.system_metrics,
        system_metrics_interval_s: float = _Defaults.system_metrics_interval_s,
        outage_wait_s: float = _Defaults.outage_wait_s,
        register_as: Optional[str] = _Defaults.register_as,
        log_onnx: bool = _Defaults.log_onnx,
        rank: int = 0,
    ) -> None:
        # A password in the address goes to MLflow's credential variables: it is sent, never shown.
        self.tracking_uri = client_credentials(tracking_uri)
        self.experiment_name = experiment_name
        self.artifact_root = artifact_root
        self.run_name = run_name
        self.flush_every_n_steps = flush_every_n_steps
        self.flush_every_s = flush_every_s
        self.log_checkpoint = log_checkpoint
        self.log_checkpoints = (
            log_checkpoints  # read by the `best` callback's config and seqlab.train
        )
        self.synchronous = synchronous  # the store holds each write before training goes on
        self.system_metrics = system_metrics
        self.system_metrics_interval_s = system_metrics_interval_s
        self.outage_wait_s = outage_wait_s
        self.register_as = (
            register_as  # the logged model also becomes a version of this registered model
        )
        self.log_onnx = log_onnx  # the network kept also as ONNX (tracking.model_logging.log_onnx)
        self.rank = rank
        self.samples = None  # tracking.system_metrics: this run's, while it is sampled
        self.ended = False  # this process ended its run (a heartbeat then knows an end is its own)
        # Whether connecting ends the store's dead runs first: a pack's members open their runs
        # at one moment, so its first member's tracker does it for all (packing.member_runs).
        self.reap = True
        self.client: Optional[mlflow.MlflowClient] = None
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.history = MetricHistory()
        # Epoch-level points (validation, best_*, about a dozen an epoch; not the per-step series,
        # which `history` holds as pairs) as logged, timestamps included: a logged model is linked
        # to those of its step (model_logging).
        self.points: list[Metric] = []
        self.sender: Any = None
        # A resumed run: the last step each metric was stored at (seqlab.tracking.replayed_steps).
        self.replayed: dict[str, int] = {}
        self._artifact_dir: Optional[Path] = None
        self.costs = Costs()  # this run's bookkeeping, phase by phase (tracking.costs)

    @property
    def is_server(self) -> bool:
        return is_server(self.tracking_uri)

    def connect(self) -> mlflow.MlflowClient:
        if self.client is None:
            with self.costs.phase("store"):
                self._connect()
        return self.client

    def _connect(self) -> None:
        """The store reached (its dead runs ended) and the experiment made where it is missing."""
        try:
            client = client_for(
                self.tracking_uri
            )  # a database server that does not answer: one line (store.local)
            if self.reap:
                end_dead_runs(client)  # runs whose process died without closing them
        except SeqlabError:
            raise
        except Exception as error:  # noqa: BLE001 - a database store's driver errors: one line, the password masked
            if not is_database(self.tracking_uri):
                raise
            raise SeqlabError(
                f"logger.tracking_uri={mask_uris(self.tracking_uri)}: the tracking database cannot be used: "
                f"{mask_text(one_line(error))[:300]}; check that its server is up and the URL, user and database are right"
            ) from None
        self.client = client
        where = artifact_location(self.tracking_uri, self.artifact_root, self.experiment_name)
        self.experiment_id = ensure_experiment(self.client, self.experiment_name, where)

    # -- lifecycle -------------------------------------------------------------------------
    def start(
        self,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: Optional[str] = None,
        description: str = "",
        resume_run_id: Optional[str] = None,
        journal_dir: Optional[Path] = None,
    ) -> str:
        """Create the run (a child of parent_run_id if given) and return its id; or open the
        existing run `resume_run_id` again, to continue it. `journal_dir`: where the run
        keeps its metrics' journal (seqlab.delivery.journal; None: a private temporary folder)."""
        if self.rank > 0:
            self.sender = NullSender()
            return ""
        client = self.connect()
        with self.costs.phase("run"):
            return self._start(
                client, run_name, tags, parent_run_id, description, resume_run_id, journal_dir
            )

    def _start(
        self,
        client: mlflow.MlflowClient,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: Optional[str],
        description: str,
        resume_run_id: Optional[str],
        journal_dir: Optional[Path],
    ) -> str:
        all_tags = {k: str(v) for k, v in tags.items()}
        if not resume_run_id:
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            if description:
                all_tags["mlflow.note.content"] = description
        all_tags = mask_flat(all_tags)  # e.g. hydra_overrides quotes the command line
        if resume_run_id:
            self.replayed = logged_through(
                client, resume_run_id
            )  # steps trained again are stored once
            # Its new process's tags first: a store opened meanwhile must not take it for the dead one.
            client.log_batch(resume_run_id, tags=[RunTag(k, v) for k, v in all_tags.items()])
            client.update_run(resume_run_id, status="RUNNING")
            if (
                "failure_reason" in client.get_run(resume_run_id).data.tags
            ):  # why it stopped then: not why it ends now
                client.delete_tag(resume_run_id, "failure_reason")
            self.run_id = resume_run_id
        else:
            self.run_id = client.create_run(
                self.experiment_id, run_name=run_name, tags=all_tags
            ).info.run_id
        self.sender = JournalSender(
            client,
            self.run_id,
            MetricJournal(journal_dir, self.run_id),
            self.is_server,
            self.outage_wait_s,
            self.synchronous,
        )
        return self.run_id

    def start_system_metrics(self) -> None:
        """Sample CPU, memory (and GPU utilisation, memory, power) into this run, as system/...
        metrics, so utilisation shows next to throughput: the process's sampler
        (tracking.system_metrics), its samples sent with the run's next metrics."""
        if not self.system_metrics or self.samples is not None or self.rank > 0:
            return
        self.samples = listen(self.system_metrics_interval_s)

    def _stop_system_metrics(self) -> None:
        """What was sampled so far sent, and no more sampling into this run."""
        if self.samples is None:
            return
        self.samples.stop()
        self.sender.metrics(self._sampled())
        self.samples = None

    def _sampled(self) -> list[Metric]:
        rows = self.samples.take() if self.samples is not None else []
        return [Metric(k, v, ts, step) for k, v, ts, step in rows]

    def end(self, status: str, reason: Optional[str] = None) -> None:
        self.ended = True
        try:
            self._stop_system_metrics()
        except Exception:  # noqa: BLE001 - system metrics are not worth losing the run over
            self.samples = None
        self.sender.end(status, reason)
        self._give_up_process()

    def _give_up_process(self) -> None:
        """The run's process tag emptied once the run has ended (after, so that a crash in
        between leaves a run the reaper can still judge): a client that reopens the run later
        is not judged by this process's death (seqlab.store.ghosts)."""

        try:
            self.client.set_tag(self.run_id, PID, "")
        except Exception:  # noqa: BLE001 - an ended run's ownership is not worth an error
            pass

    @contextmanager
    def run(
        self,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: Optional[str] = None,
        description: str = "",
        resume_run_id: Optional[str] = None,
        journal_dir: Optional[Path] = None,
    ) -> Iterator["MlflowTracker"]:
        """Open a run (or reopen `resume_run_id`); end it FINISHED if the block completes, else as
        seqlab.ending_status says (KILLED if interrupted, FAILED with the reason as `failure_reason`)."""
        self.start(run_name, tags, parent_run_id, description, resume_run_id, journal_dir)
        error = None
        try:
            yield self
        except BaseException as failure:
            error = failure
            raise
        finally:
            self.end(*ending_status(error))

    # -- records ---------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, str]) -> None:
        params = mask_flat(params)  # what a run records never holds a credential
        self.sender.params([Param(key, value[:6000]) for key, value in params.items()])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        tags = mask_flat({k: str(v) for k, v in tags.items()})
        self.sender.tags([RunTag(k, v) for k, v in tags.items()])

    def set_tags_now(self, tags: Mapping[str, Any]) -> None:
        """Tags stored before anything still queued (a server's backlog): the resume point's."""
        tags = mask_flat({k: str(v) for k, v in tags.items()})
        self.sender.tags_now([RunTag(k, v) for k, v in tags.items()])

    def unsent_metrics(self) -> list[Metric]:
        """The metrics sent so far that the store does not hold yet."""
        return self.sender.unsent()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.points.extend(batch)
        self._send(batch)

    def log_series(
        self, series: Mapping[str, list[float]], steps: list[int], timestamps: list[int]
    ) -> None:
        """Many steps of some metrics in as few calls as MLflow allows."""
        self._send(
            [
                Metric(name, float(v), ts, step)
                for name, values in series.items()
                for v, step, ts in zip(values, steps, timestamps)
            ]
        )

    def _send(self, metrics: list[Metric]) -> None:
        self.history.add(metrics)
        if self.replayed:
            metrics = not_yet_logged(metrics, self.replayed)
        # With the system metrics sampled since (their own steps 0, 1, ...: not the replayed ones)
        self.sender.metrics(metrics + self._sampled())

    def wait_for_metrics(self) -> None:
        """Every metric sent so far is stored when this returns."""
        self.sender.wait()

    def sync_metrics(self, timeout_s: float = SYNC_WAIT_S, idle: bool = False) -> None:
        """Every metric sent so far is stored when this returns; training goes on sending after.
        `idle`: a server's backlog is waited for while it keeps taking writes (senders.JournalSender.sync)."""
        self.sender.sync(timeout_s, idle)

    def draw_curves(self, series: Mapping[str, Any], png: Path, title: str) -> Any:
        """The training-curves figure of `series` (plots.series_to_draw) drawn into `png` while the
        caller goes on, by the delivery process where there is one (delivery.figures); `.wait()`
        gives the PNG, drawn."""
        return self.sender.curves(Curves.write(series, png, title))

    def log_artifact(self, path: Path | str, artifact_path: Optional[str] = None) -> None:
        self.sender.artifact(Path(path), artifact_path)

    def local_artifact_dir(self) -> Optional[Path]:
        """Where this run's artifacts are, if they are files this process writes itself."""
        if (
            self._artifact_dir is None
            and self.client is not None
            and self.run_id
            and not self.is_server
        ):
            uri = self.client.get_run(self.run_id).info.artifact_uri
            parsed = urlparse(uri)
            if parsed.scheme in ("", "file"):
                self._artifact_dir = Path(unquote(parsed.path))
        return self._artifact_dir

    def last(self, name: str) -> Optional[float]:
        return self.history.last(name)
