"""A DDP job's other processes, watched from rank 0: when one dies (killed, out of memory, an
error of its own), the job ends FAILED with one line that names the rank, instead of rank 0
being killed with it and its MLflow run left RUNNING.

Lightning's launcher starts ranks 1..N-1 as child processes of rank 0 and watches them with a
thread that, when one dies, SIGKILLs the others *and rank 0*: nothing then ends the run or says
which process it was. `RankWatch` takes that thread's place: it notes the first rank that died,
stops the others (they would wait in a collective forever), and lets rank 0 fail the usual way
(its next collective raises; `reason_for` turns that into the rank's line). Should rank 0 stay
stuck anyway, after `grace_s` the watch ends the run itself and exits."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl

from seqlab import SeqlabError

log = logging.getLogger("seqlab")


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class RankWatch(pl.Callback):
    """Made with `installed()` before the Trainer launches its processes (single node: ranks are
    the launcher's children in order, rank i = child i-1), and given to the Trainer as a callback,
    so that the job finds it when fit raises (`rank_that_died`) and it stops with fit."""

    def __init__(
        self,
        output_dir: Path,
        on_stuck: Optional[Callable[[str], None]] = None,
        poll_s: float = 0.5,
        grace_s: float = 30.0,
    ) -> None:
        self.output_dir = output_dir
        self.on_stuck = on_stuck
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.procs: list[subprocess.Popen] = []
        self.failure: Optional[str] = None  # the line naming the rank that died
        self.handled = threading.Event()  # rank 0 reported the failure itself
        self._stop = threading.Event()

    @classmethod
    def installed(cls, output_dir: Path, tracker) -> "RankWatch":
        """A watch in the place of Lightning's process observer for the launch that follows; if
        rank 0 stays stuck after a death, it ends `tracker`'s run itself."""

        from seqlab.training.lightning_private import (  # Lightning: only under DDP
            set_ddp_process_observer,
        )

        watch = cls(output_dir, on_stuck=partial(end_stuck_job, tracker))
        set_ddp_process_observer(watch.start)
        return watch

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.close()  # rank 0 is not stuck: the job's own error handling takes over (rank_that_died)

    def start(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        threading.Thread(target=self._watch, name="seqlab-rank-watch", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check():
                break
            if all(proc.returncode == 0 for proc in self.procs):
                return  # every rank finished
        if self.failure is None:
            return
        if (
            not self.handled.wait(self.grace_s)
            and self.on_stuck is not None
            and not self._stop.is_set()
        ):
            self.on_stuck(self.failure)  # rank 0 is stuck in a collective that never returns

    def check(self) -> bool:
        """Whether a rank has died (noted in `failure`, the other ranks stopped)."""
        if self.failure is not None:
            return True
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code:  # None: running; 0: done
                log_file = self.output_dir / f"train_ddp_process_{rank}.log"
                self.failure = (
                    f"DDP process rank {rank} (pid {proc.pid}) {describe_exit(code)}, so the job "
                    f"stopped; its output: {log_file}"
                )
                for other in self.procs:
                    if other.poll() is None:
                        other.send_signal(
                            signal.SIGKILL
                        )  # they would wait for it in a collective forever
                return True
        return False

    def reason_for(self, error: BaseException, wait_s: float = 10.0) -> Optional[SeqlabError]:
        """The error rank 0 should end with, when its own came from a rank that died (a collective
        that lost its peer): the line naming that rank. None when no rank died. A one-line error
        of rank 0's own (bad data, divergence) or an interruption stays as it is."""
        if isinstance(error, (SeqlabError, KeyboardInterrupt)) or not self.procs:
            return None
        deadline = (
            time.monotonic() + wait_s
        )  # the peer's death may reach rank 0 before its exit status does
        while not self.check() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.failure is None:
            return None
        self.handled.set()
        return SeqlabError(self.failure)


def rank_that_died(trainer: Any, error: BaseException) -> Optional[SeqlabError]:
    """The one-line error for `error`, raised by fit, when a DDP rank died (see RankWatch.reason_for)."""
    watch = next((c for c in getattr(trainer, "callbacks", []) if isinstance(c, RankWatch)), None)
    return watch.reason_for(error) if watch is not None else None


def end_stuck_job(tracker, failure: str) -> None:
    """The last resort, from the watch's thread: end the run FAILED, say why, and exit."""
    log.error("error: %s", failure)
    try:
        tracker.end("FAILED", failure)
    finally:
        os._exit(1)
