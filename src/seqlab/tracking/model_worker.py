"""A run's networks logged as MLflow models (tracking.model_logging.log_networks) from what its end
hands over (`ModelsToLog`): here, or in one process beside the training process (`ModelWorker`).

Why a second process (issue 35): a pack's members end one after another, and each member's models
(the PyTorch model, its ONNX copy, the best checkpoint: a dozen store writes and files each, about
0.25 s of Python a member on this project's 2-core VM) kept the second core idle while the
training process also drew that member's figure and wrote its records. Threads gain nothing (a
figure holds the GIL; torch.onnx.export refuses two exports at once); a process does: it logs
member k's models while the training process writes member k + 1's records and figure.

`logger.model_worker`: auto (a pack of AUTO_FROM members or more: below that its start, about
2.4 s of imports on the idle core, buys little), on, off. One worker a training process, started
as its first such pack sets up (its imports overlap the pack's setup, not its training) and kept
for the process's later jobs. The worker ignores Ctrl-C and SIGTERM (the training process decides
when to stop) and ends with it; one that died is replaced by logging here."""

from __future__ import annotations

import copy
import logging
import multiprocessing
import os
import pickle
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Optional

from seqlab.tracking.model_logging import Kept, LoggedNetwork, log_networks
from seqlab.tracking.records import Best

log = logging.getLogger("seqlab")

AUTO_FROM = 8  # members: logger.model_worker=auto uses the worker for packs this wide or wider
# What a worker inherits from the environment at its start that a later job may change: the
# store's credentials (tracking.connect moves an address's password there, never onto a command
# line). A job with other values gets a new worker.
_CREDENTIALS = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
)


@dataclass
class RunModels:
    """The run, as log_networks sees it where its models are logged: its store and ids, what it
    links its models' metrics from and the logger settings. Its metrics are stored before it is
    handed over (the training process waits for them), so there is nothing to wait for here; a
    tag (a registered model's) goes back to the run's own tracker."""

    tracking_uri: str
    experiment_id: str
    run_id: str
    points: list  # mlflow Metric rows at the models' steps
    log_checkpoints: str
    register_as: Optional[str]
    log_onnx: bool
    outage_wait_s: float
    tags: dict[str, str] = field(default_factory=dict)

    def wait_for_metrics(self) -> None:
        pass  # stored before the hand-over (tracking.lifecycle.record_end)

    def sync_metrics(self, timeout_s: float = 0.0, idle: bool = False) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update({k: str(v) for k, v in tags.items()})


@dataclass
class ModelsToLog:
    """What log_networks needs of a run's end, handed over whole (the network on the CPU)."""

    run: RunModels
    network: Any
    example_x: Any
    kept: Kept
    best: Optional[Best]
    best_weights: Optional[dict[str, Any]]
    logged: list[tuple[str, int]]

    @classmethod
    def of(cls, tracker: Any, ending: Any) -> "ModelsToLog":
        steps = {ending.kept.step, *(step for _, step in ending.logged)}
        if ending.best is not None:
            steps.add(ending.best.step)
        run = RunModels(
            tracker.tracking_uri,
            tracker.experiment_id,
            tracker.run_id,
            [m for m in tracker.points if m.step in steps],
            tracker.log_checkpoints,
            tracker.register_as,
            tracker.log_onnx,
            tracker.outage_wait_s,
        )
        best_weights = (
            {k: v.detach().cpu() for k, v in ending.best_weights.items()}
            if ending.best_weights is not None
            else None
        )
        network = _on_cpu(ending.network)
        return cls(
            run, network, ending.example_x, ending.kept, ending.best, best_weights, ending.logged
        )


def _on_cpu(network: Any) -> Any:
    return copy.deepcopy(network).to("cpu")


@dataclass
class ModelsLogged:
    logged: Optional[LoggedNetwork]  # the network kept, as log_networks returns it
    tags: dict[str, str]  # for the run's own tracker to set
    lines: list[tuple[int, str]]  # what logging them said, for the job's log (the worker's)
    seconds: float  # what logging them took


def log_models(models: ModelsToLog) -> ModelsLogged:
    """The run's models logged: in this process, or the worker's (`_in_worker`)."""
    start = time.perf_counter()
    r = models.run
    logged = log_networks(
        r,
        models.network,
        models.example_x,
        models.kept,
        models.best,
        models.best_weights,
        models.logged,
    )
    return ModelsLogged(logged, r.tags, [], time.perf_counter() - start)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def _in_worker(payload: bytes) -> ModelsLogged:
    # Plain pickle both ways: the training process's own bytes through its own pipe (the tensors by
    # value, not through shared memory and a file-descriptor server).
    lines = _Lines()
    log.addHandler(lines)
    try:
        done = log_models(pickle.loads(payload))
    finally:
        log.removeHandler(lines)
    done.lines = lines.lines
    return done


def _start_worker() -> None:
    """The worker's start: its imports, before the first member's models come; Ctrl-C and
    SIGTERM left to the training process; its log lines go back with each result, not to stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log.propagate = False
    log.setLevel(logging.INFO)  # what the training process's job log would have said
    import mlflow.onnx  # noqa: F401
    import mlflow.pytorch  # noqa: F401
    import onnxruntime  # noqa: F401


def _ready() -> bool:
    return True


class ModelWorker:
    """The process beside this one that logs runs' models; `submit` gives a Future of ModelsLogged."""

    def __init__(self) -> None:
        self.env = {k: os.environ.get(k) for k in _CREDENTIALS}
        self.pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
        )
        self.pool.submit(_ready)  # starts it now: its imports overlap the pack's setup

    def submit(self, models: ModelsToLog) -> "Pending":
        return Pending(models, self.pool.submit(_in_worker, pickle.dumps(models)))

    def current(self) -> bool:
        return self.env == {k: os.environ.get(k) for k in _CREDENTIALS}

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class Pending:
    """A run's models on their way: the worker's result, or what logging them here gave. A worker
    that died (killed, out of memory) leaves this run's models to this process."""

    def __init__(self, models: ModelsToLog, future: Optional[Future] = None) -> None:
        self.models, self.future = models, future
        self.done = None if future is not None else log_models(models)

    def result(self) -> ModelsLogged:
        if self.done is None:
            try:
                self.done = self.future.result()
            except BrokenProcessPool:
                global _WORKER
                _WORKER = None
                log.warning("model     the models' process ended; this run's models logged here")
                self.done = log_models(self.models)
        return self.done


_WORKER: Optional[ModelWorker] = None


def beside(setting: str, members: int) -> Optional[ModelWorker]:
    """The process's worker where `logger.model_worker` and the pack's width want it (started here
    the first time), else None: the models are logged in this process."""
    global _WORKER
    wanted = setting == "on" or (setting == "auto" and members >= AUTO_FROM)
    if not wanted:
        return None
    if _WORKER is not None and not _WORKER.current():
        _WORKER.close()
        _WORKER = None
    if _WORKER is None:
        _WORKER = ModelWorker()
    return _WORKER


def submit(worker: Optional[ModelWorker], models: ModelsToLog) -> Pending:
    """The models logged by `worker`, or here now without one."""
    return worker.submit(models) if worker is not None else Pending(models)
