"""System metrics (CPU, memory, disk, network; an NVIDIA or AMD GPU's utilisation, memory, power)
sampled once per process for every run it has open, and sent with each run's other metrics.

MLflow's own monitor is a thread per run that, at every sample, reads the whole run back from the
store (to see whether it still runs) and writes the sample through MLflow's ORM. In a pack of 8
that is 9 threads (the members and the sweep's parent run), and py-spy counted 11.6 s of the
training process's CPU in them during one 60-s command on the 2-core VM, whose cores the training
wants. Here one thread samples with MLflow's own samplers (the same metrics under the same names,
`system/...`), and each run's samples wait in its queue until the run's own thread sends them
with its next metrics, the way its other metrics leave it (its journal, which the delivery process
sends): no store access from the sampler, no sender used from two threads."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

from seqlab.tracking.mlflow_private import system_samplers

PREFIX = "system/"


class Samples:
    """One run's samples: (metrics, step, time in ms) in the order taken, taken by its run's thread."""

    def __init__(self, sampler: "Sampler") -> None:
        self.sampler = sampler  # the process's, for the run's interval
        self.queue: deque = deque()  # appended by the sampler's thread, emptied by the run's
        self.step = 0  # MLflow's monitor numbers a run's samples 0, 1, 2, ...

    def stop(self) -> None:
        """No more samples into this run (those waiting stay, for take)."""
        self.sampler.remove(self)

    def take(self) -> list[tuple[str, float, int, int]]:
        """Every sample waiting, as (key, value, timestamp ms, step) rows."""
        rows = []
        while self.queue:
            metrics, step, ts = self.queue.popleft()
            rows.extend((k, v, ts, step) for k, v in metrics.items())
        return rows


class Sampler:
    """A thread that samples every `interval_s` seconds while at least one run listens."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.listeners: list[Samples] = []
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        node = os.environ.get("MLFLOW_SYSTEM_METRICS_NODE_ID")  # as MLflow's monitor names a node
        self.prefix = PREFIX + (f"{node}/" if node else "")

    def add(self, samples: Samples) -> None:
        with self.lock:
            self.listeners.append(samples)
            if self.thread is None:
                self.wake.clear()
                self.thread = threading.Thread(
                    target=self._run, name="seqlab-system-metrics", daemon=True
                )
                self.thread.start()

    def remove(self, samples: Samples) -> None:
        with self.lock:
            if samples in self.listeners:
                self.listeners.remove(samples)
            if not self.listeners:
                self.wake.set()  # the thread ends now, not at its next sample

    def _run(self) -> None:
        samplers: list[Any] = system_samplers()
        while True:
            self.wake.wait(self.interval_s)
            with self.lock:
                if not self.listeners:
                    self.thread = None  # under the lock: a run added after this starts a new one
                    return
                woken, _ = self.wake.is_set(), self.wake.clear()
            if woken:
                continue  # a run left while others listen: theirs are sampled at the next interval
            metrics: dict[str, float] = {}
            for sampler in list(samplers):
                try:
                    sampler.collect_metrics()
                    metrics.update(sampler.aggregate_metrics())
                    sampler.clear_metrics()
                except Exception:  # noqa: BLE001 - a GPU that went away: the others go on
                    samplers.remove(sampler)
            named = {self.prefix + k: float(v) for k, v in metrics.items()}
            now = int(time.time() * 1000)
            with self.lock:
                for samples in self.listeners:
                    samples.queue.append((named, samples.step, now))
                    samples.step += 1


_SAMPLERS: dict[float, Sampler] = {}
_LOCK = threading.Lock()


def _forget_samplers() -> None:
    """A forked child has none of its parent's threads: its runs start samplers of their own."""
    global _LOCK
    _SAMPLERS.clear()
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_samplers)


def listen(interval_s: float) -> Samples:
    """A run's samples from now on, every interval_s seconds (one sampler per interval and process)."""
    with _LOCK:
        sampler = _SAMPLERS.setdefault(interval_s, Sampler(interval_s))
    samples = Samples(sampler)
    sampler.add(samples)
    return samples
