"""What the tests in `integration/test_cluster.py` and `integration/test_preemption.py` share
(under tests/)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

from conftest import runs_of

# A job alone and a pack in one sweep (seed=0,1,2 pack=2: a pack of the first two, the third alone),
# each long enough to be stopped mid-run: 13 steps an epoch (819 training samples, batch 64), 20 epochs
# (two jobs on two cores: an epoch takes a tenth of a second or more). Each job is stopped once it has
# printed its second epoch, and stops at its next call's end (13 steps a call): on the loaded 2-core VM
# within 2 epochs, leaving more than 15 to train after its requeue.
BOTH = ["seed=0,1,2", "pack=2", "data.n_samples=1024", "trainer.max_epochs=20"]
BOTH_STEPS = 13 * 20


def _runs(client, experiment: str):
    runs = runs_of(client, experiment)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    return parents, [r for r in runs if r.data.tags.get("sweep_role") != "parent"]


def _job_logs(tmp_path: Path) -> str:
    """What the sweep's jobs printed (submitit keeps each task's stdout and stderr)."""
    return "".join(
        p.read_text(errors="replace")
        for p in sorted(tmp_path.glob("logs/multiruns/*/.submitit/*/*_log.*"))
    )


def _stop_each_once_training(tmp_path: Path, proc, n: int, stop, timeout: float = 120) -> None:
    """Stops each of the sweep's n jobs as soon as it has finished its second epoch, each on its own
    (`stop(job id)`: its submitit folder's name, a local job's pid or SLURM's array task), so that
    no job has finished by the time it is stopped, however the machine's load staggers them."""
    stopped, deadline = set(), time.monotonic() + timeout
    while len(stopped) < n:
        for folder in sorted(tmp_path.glob("logs/multiruns/*/.submitit/*")):
            if (
                folder.name not in stopped
                and "%" not in folder.name
                and any("epoch 2/" in p.read_text(errors="replace") for p in folder.glob("*_log.*"))
            ):
                stop(folder.name)
                stopped.add(folder.name)
        assert proc.poll() is None, f"the sweep ended before {n} jobs trained"
        assert time.monotonic() < deadline, (
            f"{n} jobs did not train within {timeout:.0f} s:\n{_job_logs(tmp_path)[-3000:]}"
        )
        time.sleep(0.1)


def _each_step_once(client, run_id: str, key: str = "train_loss") -> list[int]:
    steps = [m.step for m in client.get_metric_history(run_id, key)]
    twice = [s for s, n in collections.Counter(steps).items() if n > 1]
    assert not twice, f"{key} stored twice at steps {twice[:10]}"
    return sorted(steps)
