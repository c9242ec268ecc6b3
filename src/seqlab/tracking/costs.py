"""What a run spends outside training, phase by phase (issue 35): the store, the run's creation,
its params, code and datasets, its models, figures and final records, its end. Each run's
tracker holds its own `Costs`; what a process pays once for all its runs (the imports, the data
and networks, a pack's members' configs) is `PROCESS`'s. At its end each run writes both, with its
training time and when its process's first job began (the time before it is the process's start),
to costs.json in its job's folder, where `scripts/benchmark.py --overhead` reads them
(seqlab.benchmark.overhead).

Phases nest without counting twice: time spent in an inner phase is the inner one's only. A phase
costs two clock reads, so it is always on. Light: the standard library only (seqlab.task imports it)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

FILE = "costs.json"


@dataclass
class Costs:
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase, in first-seen order
    training_s: Optional[float] = None  # the fit's wall time (a pack's: every member's)
    _open: list[list] = field(default_factory=list)  # [name, start, seconds in inner phases]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        frame = [name, time.perf_counter(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.remove(frame)
            total = time.perf_counter() - frame[1]
            self.phases[name] = self.phases.get(name, 0.0) + total - frame[2]
            if self._open:
                self._open[-1][2] += total

    def clear(self) -> None:
        self.phases.clear()
        self.training_s = None


# What this process pays once for the runs it trains; cleared as each job starts (seqlab.task), so
# a sweep's later jobs in one process show what they did not pay again.
PROCESS = Costs()
# When this process's first job began (time.time()): what came before (the interpreter, the command
# line's imports, Hydra's composing, a sweep's start) is known to whoever started the process and
# noted the time (benchmark.overhead); the process's own start time (/proc) is too coarse for it.
first_job_at: Optional[float] = None


def job_starts() -> None:
    """A job's task begins: the process's costs start anew."""
    global first_job_at
    PROCESS.clear()
    if first_job_at is None:
        first_job_at = time.time()


def write(job_dir: Path, run: Costs, job: Optional[int], pack_id: Optional[str] = None) -> None:
    """costs.json of one run: its own phases, its process's (the same for every member of a pack:
    `job` and `pack_id` tell a reader which runs shared one) and its training time. Best effort: a
    full disk here must not change how the run ended."""
    record = {
        "job": job,
        "pack_id": pack_id,
        "training_s": run.training_s,
        "run": run.phases,
        "process": PROCESS.phases,
        "first_job_at": first_job_at,
        "written_at": time.time(),  # the run's end: what a command does after its last run is past it
    }
    try:
        (job_dir / FILE).write_text(json.dumps(record, indent=1) + "\n")
    except OSError:
        pass
