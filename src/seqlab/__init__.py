"""seqlab: config-driven CNN-LSTM experiments tracked in MLflow.

Importing the package is cheap on purpose (no torch, Lightning or MLflow): the CLI's start-up
path (`train.py --help`, `--cfg job`) goes through here.
"""

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

__version__ = "0.1.0"

# MLflow 3 sends usage telemetry to its makers by default, from threads that a process's exit then
# waits up to a second each for. A run's records are its user's: off unless the user says otherwise
# (MLFLOW_DISABLE_TELEMETRY=false). Set here, before anything imports MLflow, and inherited by the
# processes seqlab starts (the delivery process, DDP's ranks, a sweep's workers).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# torch's CPU allocator asks the kernel for transparent huge pages for its large tensors only when
# this is set (c10's alloc_cpu reads it at its first allocation, so here, before torch loads). A
# pack's data is gigabytes of fresh memory (32 sets of 16,384 days, then joined), and faulting it
# in 4 KiB pages was most of its time: 16 sets made and joined in 9.2 s without, 4.7 s with, on
# this project's 2-core VM (whose kernel gives huge pages where asked: madvise).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


class SeqlabError(Exception):
    """A problem the user can fix: printed as one line, never as a traceback."""


class ResumableStop(SeqlabError):
    """A stop the run continues from with resume= once its cause is fixed (a write that found no
    room: safe_writes.WriteFailed): its run ends KILLED, not FAILED."""


def ending_status(error: "BaseException | None") -> "tuple[str, str | None]":
    """The status and reason a run (and its job's result) ends with when `error` stopped it (None:
    nothing did): KILLED for an interruption or a ResumableStop, FAILED for anything else."""
    if error is None:
        return "FINISHED", None
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return "KILLED", "interrupted"
    return ("KILLED" if isinstance(error, ResumableStop) else "FAILED"), one_line(error)


def one_line(error: BaseException) -> str:
    """An error as one line of at most 500 characters, for consoles, tags and summaries."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def require_tested(package: str, version: str, tested: tuple[str, ...], name: str) -> None:
    """Before seqlab uses a library's internals (training/lightning_private.py, sweeps/optuna_private.py,
    tracking/mlflow_private.py): one line if the installed release is not one they were tested with."""
    if not version.startswith(tested):
        raise SeqlabError(
            f"{package} {version} is installed, but seqlab uses {name} internals tested only with "
            f"{', '.join(v + 'x' for v in tested)}: install that version (make install does: requirements.lock)"
        )


@contextmanager
def imports_without_gc(module: str) -> Iterator[None]:
    """The first import of a heavy `module` (torch, Lightning and MLflow with seqlab.train; MLflow's
    SQL store), without the cyclic garbage collector. Such imports make hundreds of thousands of
    long-lived objects and almost no garbage, yet each full collection walks every one of them:
    about 9 of them while the default run imported (1.3 s on the 2-core VM). Once in, they are
    frozen out of the collector's view (gc.freeze, as CPython's docs advise for a long-lived
    process's start-up objects), so that later collections and the interpreter's last one at exit
    (1.2 s of the default run's exit) leave them alone. Nothing is done where `module` is loaded
    already: a sweep's later jobs would otherwise freeze the earlier jobs' garbage for good."""
    if module in sys.modules:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
