"""MLflow tracking: one run per job, its params (the whole resolved config), tags, metrics and
artifacts, and its final status. The tracker owns the run's lifecycle (`MlflowTracker.run`), so a
run is never left RUNNING, whatever ends the job.

Per-step metrics are kept on the training device and sent in batches (`StepMetricsRecorder`):
reading a loss back every step would synchronise the device every step.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import mlflow
import pytorch_lightning as pl
import torch
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities import rank_zero_only

from seqlab import SeqlabError, one_line
from seqlab.outbox import Outbox, transient

log = logging.getLogger("seqlab")

MAX_BATCH = 1000  # MLflow's log_batch accepts at most 1000 metrics and 100 params per call
MAX_PARAMS = 100


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


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "default"


class MlflowTracker:
    """Built from conf/logger/mlflow.yaml. `run()` opens a run; everything else logs to it."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str = "seqlab",
        artifact_root: Optional[str] = None,
        run_name: Optional[str] = None,
        flush_every_n_steps: int = 50,
        flush_every_s: float = 1.0,
        log_checkpoint: bool = True,
        synchronous: bool = False,
        system_metrics: bool = False,
        system_metrics_interval_s: float = 2.0,
        outage_wait_s: float = 60.0,
        fallback_uri: Optional[str] = None,
        step_writer: str = "process",
        register_as: Optional[str] = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.artifact_root = artifact_root
        self.run_name = run_name
        self.flush_every_n_steps = flush_every_n_steps
        self.flush_every_s = flush_every_s
        self.log_checkpoint = log_checkpoint
        # Metrics go to MLflow in the background unless synchronous; `flush` waits for them.
        self.synchronous = synchronous
        self.pending: list[Any] = []
        self.system_metrics = system_metrics
        self.system_metrics_interval_s = system_metrics_interval_s
        self.monitor = None
        self.client: Optional[mlflow.MlflowClient] = None
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        # Every metric point logged, kept for the training-curves plot and the final summary.
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        # The last optimizer step seen: epoch-level metrics are logged at it, so that they line
        # up with the per-step series (Lightning's own logging step lags by one at epoch end).
        self.step = 0
        # A tracking server may go away mid-run: writes then wait in the outbox (seqlab.outbox);
        # at the end, up to outage_wait_s for it to come back, else the run is copied whole to
        # fallback_uri. What was logged is kept for that copy.
        self.outage_wait_s = outage_wait_s
        self.fallback_uri = fallback_uri
        self.outbox = None
        self.logged: dict[str, Any] = {"params": {}, "tags": {}, "metrics": [], "artifacts": [], "name": None}
        self.unsent_artifacts: list[tuple[Path, Optional[str]]] = []
        # A running run's metrics into a local store: "process" (seqlab.step_writer, off the
        # training process) or "inline" (MLflow's own background logging, in this process).
        self.step_writer = step_writer
        self.writer = None
        self.register_as = register_as  # the logged model also becomes a version of this registered model

    # -- lifecycle -------------------------------------------------------------------------
    def connect(self) -> mlflow.MlflowClient:
        if self.client is None:
            if self.is_server:
                check_server(self.tracking_uri)
                # The outbox retries on its own schedule; MLflow's default (7 retries with a
                # doubling back-off, 120 s timeouts) would hold each write for minutes.
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
                # MLflow prints its own run links (without the UI's model-training view) as each
                # run ends; the report prints one that opens the runs (seqlab.ui).
                os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
                # While a server is away, the outbox says so once; urllib3 would warn per retry.
                logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
            if self.tracking_uri.startswith("sqlite:///"):
                Path(self.tracking_uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
            self.client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
            self.experiment_id = ensure_experiment(
                self.client, self.experiment_name, self._artifact_location()
            )
        return self.client

    @property
    def is_server(self) -> bool:
        return self.tracking_uri.startswith(("http://", "https://"))

    def _artifact_location(self) -> Optional[str]:
        # A local store needs an explicit artifact folder (MLflow would pick one relative to the
        # working directory); a server decides its own.
        if self.artifact_root is None or self.tracking_uri.startswith(("http://", "https://")):
            return None
        path = Path(self.artifact_root).resolve() / _safe_name(self.experiment_name)
        return path.as_uri()

    def start(
        self,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: Optional[str] = None,
        description: str = "",
        resume_run_id: Optional[str] = None,
    ) -> str:
        """Create the run (a child of parent_run_id if given) and return its id; or open the
        existing run `resume_run_id` again, to continue it."""
        client = self.connect()
        self.logged["name"] = run_name
        if resume_run_id:
            client.update_run(resume_run_id, status="RUNNING")
            self.run_id = resume_run_id
            self._open_outbox()
            self.set_tags(tags)
            return self.run_id
        all_tags = dict(tags)
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        if description:
            all_tags["mlflow.note.content"] = description
        run = client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        self.run_id = run.info.run_id
        self.logged["tags"].update(all_tags)
        self._open_outbox()
        return self.run_id

    def _open_outbox(self) -> None:
        if self.is_server and self.outbox is None:
            run_id = self.run_id
            self.outbox = Outbox(lambda item: self.client.log_batch(run_id, synchronous=True, **item), self.tracking_uri)
        elif not self.is_server and self.step_writer == "process" and self.writer is None:
            from seqlab.step_writer import StepWriter

            self.writer = StepWriter(self.tracking_uri, self.run_id)

    def _close_writer(self) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        left, why = writer.close()
        if left:
            log.warning("tracking  the step writer stopped (%s): its last %d metric values are written from here",
                        why, len(left))
            self._send([Metric(k, v, ts, step) for k, v, ts, step in left], keep_history=False)

    def start_system_metrics(self) -> None:
        """Sample CPU, memory (and NVIDIA GPU utilisation, memory, power) into this run, as
        system/... metrics, so utilisation shows next to throughput. Lightning's MLflow logger
        does not switch MLflow's monitor on; it is started here for the run's id."""
        if not self.system_metrics or self.monitor is not None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=self.system_metrics_interval_s, tracking_uri=self.tracking_uri
        )
        self.monitor.start()

    def end(self, status: str, reason: Optional[str] = None) -> None:
        if self.monitor is not None:
            try:
                self.monitor.finish()  # logs what it sampled last
            except Exception:  # noqa: BLE001 - system metrics are not worth losing the run over
                pass
            self.monitor = None
        if self.outbox is not None:
            self._end_on_server(status, reason)
            return
        try:
            self._close_writer()
            self.flush()
        finally:
            if reason:
                self.set_tags({"failure_reason": reason})
            self.client.set_terminated(self.run_id, status)

    def _end_on_server(self, status: str, reason: Optional[str]) -> None:
        """Wait (up to outage_wait_s) for the server to take every write, then close the run
        there; if it does not, copy the whole run to the local fallback store."""
        if reason:
            self.set_tags({"failure_reason": reason})
        outbox, self.outbox = self.outbox, None
        if outbox.down_since is not None:
            log.warning("tracking  waiting up to %.0f s for the server at %s to take this run's last metrics",
                        self.outage_wait_s, self.tracking_uri)
        try:
            if not outbox.drain(self.outage_wait_s):
                raise ConnectionError("the tracking server did not come back")
            for path, artifact_path in self.unsent_artifacts:
                try:
                    self._upload(path, artifact_path)
                except Exception as error:  # noqa: BLE001 - the run's status matters more
                    if transient(error):
                        raise
                    log.warning("tracking  %s was not stored: %s", path.name, " ".join(str(error).split())[:200])
            self.unsent_artifacts = []
            self.client.set_terminated(self.run_id, status)
        except Exception as error:  # noqa: BLE001
            if not transient(error):
                raise
            self._copy_to_fallback(status)
        finally:
            outbox.close()
            for refused in outbox.refused:
                log.warning("tracking  the server refused a write: %s", refused)

    def _copy_to_fallback(self, status: str) -> None:
        if not self.fallback_uri:
            raise SeqlabError(f"the tracking server at {self.tracking_uri} did not come back, and "
                              "logger.fallback_uri is not set: this run's last metrics were not stored")
        local = MlflowTracker(self.fallback_uri, self.experiment_name, self.artifact_root, step_writer="inline")
        tags = {**self.logged["tags"], "server_uri": self.tracking_uri, "server_run_id": self.run_id}
        tags.pop("mlflow.parentRunId", None)  # the parent lives on the server
        local.start(self.logged["name"] or "run", tags)
        local.log_params(self.logged["params"])
        local._send(self.logged["metrics"])
        for path, artifact_path in self.logged["artifacts"]:
            local.log_artifact(path, artifact_path)
        local.end(status)
        log.warning(
            "tracking  the server at %s did not come back within %.0f s: the whole run (its params, tags, every "
            "metric and artifact) is in the local store %s as run %s (make ui shows it); on the server, run %s "
            "is incomplete", self.tracking_uri, self.outage_wait_s, self.fallback_uri, local.run_id, self.run_id,
        )

    @contextmanager
    def run(
        self,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: Optional[str] = None,
        description: str = "",
        resume_run_id: Optional[str] = None,
    ) -> Iterator["MlflowTracker"]:
        """Open a run (or reopen `resume_run_id`); end it FINISHED if the block completes, KILLED
        if interrupted, FAILED (with the reason as the `failure_reason` tag) on any other exception."""
        self.start(run_name, tags, parent_run_id, description, resume_run_id)
        status, reason = "FAILED", None
        try:
            yield self
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):
            status, reason = "KILLED", "interrupted"
            raise
        except BaseException as error:
            reason = one_line(error)
            raise
        finally:
            self.end(status, reason)

    # -- logging ---------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, str]) -> None:
        self.logged["params"].update(params)
        items = [Param(key, value[:6000]) for key, value in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.logged["tags"].update({k: str(v) for k, v in tags.items()})
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        if self.outbox is not None:
            self.outbox.put({"tags": items})
        else:
            self.client.log_batch(self.run_id, tags=items)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._send([Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_series(self, series: Mapping[str, list[float]], steps: list[int], timestamps: list[int]) -> None:
        """Many steps of some metrics in as few calls as MLflow allows."""
        self._send(
            [
                Metric(name, float(v), ts, step)
                for name, values in series.items()
                for v, step, ts in zip(values, steps, timestamps)
            ]
        )

    def _send(self, metrics: list[Metric], keep_history: bool = True) -> None:
        if keep_history:
            for m in metrics:
                self.history[m.key].append((m.step, m.value))
        if self.writer is not None:  # epoch metrics too: no MLflow write in this process while training
            self.writer.send([(m.key, m.value, m.timestamp, m.step) for m in metrics])
            return
        if self.outbox is not None:
            self.logged["metrics"].extend(metrics)
            for i in range(0, len(metrics), MAX_BATCH):
                self.outbox.put({"metrics": metrics[i : i + MAX_BATCH]})
            return
        for i in range(0, len(metrics), MAX_BATCH):
            operation = self.client.log_batch(
                self.run_id, metrics=metrics[i : i + MAX_BATCH], synchronous=self.synchronous
            )
            if operation is not None:
                self.pending.append(operation)

    def wait_for_metrics(self) -> None:
        """Every metric sent so far is stored when this returns (the step writer is closed: later
        metrics go through MLflow's client from this process)."""
        self._close_writer()
        self.flush()

    def flush(self) -> None:
        """Wait until every metric sent in the background is stored."""
        pending, self.pending = self.pending, []
        for operation in pending:
            operation.wait()

    def log_artifact(self, path: Path | str, artifact_path: Optional[str] = None) -> None:
        path = Path(path)
        if self.outbox is None:
            self._upload(path, artifact_path)
            return
        self.logged["artifacts"].append((path, artifact_path))
        if self.outbox.down_since is not None:  # known to be away: do not wait for it here
            self.unsent_artifacts.append((path, artifact_path))
            return
        try:
            self._upload(path, artifact_path)
        except Exception as error:  # noqa: BLE001
            if not transient(error):
                raise
            self.unsent_artifacts.append((path, artifact_path))  # tried again at the end

    def _upload(self, path: Path, artifact_path: Optional[str]) -> None:
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        elif path.is_file():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def last(self, name: str) -> Optional[float]:
        points = self.history.get(name)
        return points[-1][1] if points else None

    def lightning_logger(self) -> "LightningBridge":
        return LightningBridge(self)

    def silenced(self) -> "SilentTracker":
        """The same settings for a process other than rank 0 of a multi-process job."""
        silent = SilentTracker.__new__(SilentTracker)
        silent.__dict__.update(self.__dict__)
        return silent


class SilentTracker(MlflowTracker):
    """What ranks 1..N-1 of a DDP job use: rank 0 owns the job's one MLflow run; the others train
    through the same code, keep their metric history, and send nothing."""

    def connect(self) -> None:  # type: ignore[override]
        return None

    def start(self, run_name: str, tags: Mapping[str, str], parent_run_id: Optional[str] = None,
              description: str = "", resume_run_id: Optional[str] = None) -> str:
        return ""

    def start_system_metrics(self) -> None:
        pass

    def end(self, status: str, reason: Optional[str] = None) -> None:
        pass

    def log_params(self, params: Mapping[str, str]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def _send(self, metrics: list[Metric], keep_history: bool = True) -> None:
        for m in metrics:
            self.history[m.key].append((m.step, m.value))

    def log_artifact(self, path: Path | str, artifact_path: Optional[str] = None) -> None:
        pass


def check_server(uri: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds, with one line, when no MLflow server answers at `uri` (MLflow's own
    client retries for minutes before it gives up)."""
    import requests

    try:
        response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException as error:
        raise SeqlabError(
            f"logger.tracking_uri={uri}: no MLflow server answers there ({type(error).__name__}); "
            "start it (mlflow server ...) or drop logger.tracking_uri to use the local store"
        ) from None
    if response.status_code != 200:
        raise SeqlabError(f"logger.tracking_uri={uri}: the server answered HTTP {response.status_code} to /health")


def ensure_experiment(client: mlflow.MlflowClient, name: str, artifact_location: Optional[str]) -> str:
    from seqlab.ui import EXPERIMENT_KIND_TAG, MODEL_TRAINING

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # made before seqlab marked its experiments
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return experiment.experiment_id
    try:
        # Marked as model training: MLflow's UI opens it on its runs, not on a GenAI traces page.
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
    except MlflowException:
        # Another job of the same sweep created it between our look-up and our create.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


class LightningBridge(Logger):
    """Hands what the LightningModule logs with self.log (epoch-level metrics) to the tracker.
    Hyperparameters are not taken from Lightning: the tracker logs the whole resolved config."""

    def __init__(self, tracker: MlflowTracker) -> None:
        super().__init__()
        self.tracker = tracker

    @property
    def name(self) -> str:
        return self.tracker.experiment_name

    @property
    def version(self) -> str:
        return self.tracker.run_id or ""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        if metrics:
            self.tracker.log_metrics(metrics, self.tracker.step)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class Diverged(SeqlabError):
    """The loss became NaN or Inf."""


class StepLog:
    """Every optimizer step's loss, number, learning rate and time, until the recorder sends them.
    The loss stays a reference to a device tensor (no copy, no synchronisation); so does a tensor
    learning rate (CUDA graphs), which the training loop copies once per call, before a
    scheduler can change it in place."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.steps: list[int] = []
        self.lrs: list[Any] = []
        self.times: list[int] = []

    def add(self, loss: torch.Tensor, step: int, lr: Any) -> None:
        self.losses.append(loss)
        self.steps.append(step)
        self.lrs.append(lr)
        self.times.append(int(time.time() * 1000))

    def __len__(self) -> int:
        return len(self.steps)

    def take(self) -> tuple[list[torch.Tensor], list[int], list[Any], list[int]]:
        taken = self.losses, self.steps, self.lrs, self.times
        self.losses, self.steps, self.lrs, self.times = [], [], [], []
        return taken


class StepMetricsRecorder(pl.Callback):
    """Records train_loss, train_rmse and lr for every optimizer step without a per-step host
    synchronisation: the training loop adds each step to `steps` (a StepLog); between Lightning
    calls, once at least `every_n_steps` steps wait and `every_s` seconds have passed since the
    last send, their losses are read back together and sent in one batch (each send costs the
    loop a read-back and a wake-up of the writer: a few a second is live enough for a chart);
    the rest at the end of training. The per-step train_rmse is a function of the loss
    (`loss_to_mse`), so it costs the step nothing. Under DDP every process must send at the same
    steps (the losses are averaged across them): pass every_s=0 there."""

    def __init__(
        self,
        tracker: MlflowTracker,
        every_n_steps: int,
        loss_to_mse: Callable[[float], float] = lambda loss: 2.0 * loss,
        every_s: float = 0.0,
    ) -> None:
        self.tracker = tracker
        self.every_n_steps = every_n_steps
        self.every_s = every_s
        self.loss_to_mse = loss_to_mse
        self.steps = StepLog()
        self.last_sent = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Epoch-level metrics are logged at the last step trained (Lightning's own logging step lags by one at epoch end).
        self.tracker.step = trainer.global_step
        if len(self.steps) >= self.every_n_steps and time.monotonic() - self.last_sent >= self.every_s:
            self.flush()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flush()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Diverged):
            self.flush()  # the steps trained before an interruption are part of the run

    def flush(self) -> None:
        self.last_sent = time.monotonic()
        if not self.steps:
            return
        losses, steps, lrs, times = self.steps.take()
        losses = torch.stack(losses)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # DDP: each process trained on its own share of the batch; the step's loss is their
            # mean. Every process flushes at the same steps, so this collective lines up.
            torch.distributed.all_reduce(losses)
            losses = losses / torch.distributed.get_world_size()
        losses = losses.tolist()  # the one synchronisation
        rmse = [math.sqrt(max(self.loss_to_mse(v), 0.0)) if math.isfinite(v) else v for v in losses]
        diverged = next(((step, v) for step, v in zip(steps, losses) if not math.isfinite(v)), None)
        if isinstance(lrs[0], torch.Tensor):
            lrs = torch.stack(lrs).tolist()  # read back together with the losses
        else:
            lrs = [float(lr) for lr in lrs]
        self.tracker.log_series({"train_loss": losses, "train_rmse": rmse, "lr": lrs}, steps, times)
        if diverged is not None:
            # Read back at every send (logger.flush_every_n_steps, flush_every_s), so a divergence
            # stops the run within that interval without a per-step check.
            step, value = diverged
            raise Diverged(
                f"the training loss became {value} at step {step}: training diverged; "
                "lower optimizer.lr, set module.gradient_threshold, or check the data"
            )
