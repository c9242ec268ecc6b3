"""tracking.system_metrics: one sampler thread per process for every run it has open."""

from __future__ import annotations

import threading
import time

from seqlab.tracking import system_metrics
from seqlab.tracking.system_metrics import listen

INTERVAL = 0.05


def _threads() -> int:
    return sum(t.name == "seqlab-system-metrics" for t in threading.enumerate())


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_two_runs_share_one_sampler_and_each_gets_every_sample_with_its_own_steps():
    first = listen(INTERVAL)
    _wait_for(lambda: len(first.queue) >= 2)
    second = listen(INTERVAL)  # a pack's next member, or a run after the sweep's parent
    assert _threads() == 1
    _wait_for(lambda: len(second.queue) >= 2)
    a, b = first.take(), second.take()
    assert not first.queue and not second.queue  # taken: sent once
    for rows in (a, b):
        keys = {key for key, *_ in rows}
        assert "system/cpu_utilization_percentage" in keys
        assert "system/system_memory_usage_megabytes" in keys
        steps = sorted({step for *_, step in rows})
        assert steps == list(range(len(steps)))  # each run numbers its samples from 0
        assert all(isinstance(value, float) and ts > 0 for _, value, ts, _ in rows)
    first.stop()
    second.stop()
    _wait_for(lambda: _threads() == 0)  # nobody listens: the thread ends at once
    assert system_metrics._SAMPLERS[INTERVAL].thread is None


def test_a_run_that_listens_after_the_thread_ended_is_sampled_again():
    late = listen(INTERVAL)
    try:
        _wait_for(lambda: len(late.queue) >= 1)
    finally:
        late.stop()
    _wait_for(lambda: _threads() == 0)


def test_a_forked_child_forgets_its_parents_samplers():
    # What a child's runs find: no sampler whose thread lives only in the parent.
    samples = listen(INTERVAL)
    parents = system_metrics._SAMPLERS[INTERVAL]
    try:
        system_metrics._forget_samplers()  # what os.register_at_fork runs in the child
        assert not system_metrics._SAMPLERS
        child = listen(INTERVAL)  # a run of the child: a sampler (and thread) of its own
        assert system_metrics._SAMPLERS[INTERVAL] is not parents
        child.stop()
    finally:
        samples.stop()  # its sampler is the parent's, forgotten: its thread ends all the same
    _wait_for(lambda: _threads() == 0)
