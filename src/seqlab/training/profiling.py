"""Why is a step slow on this machine? A short run under torch.profiler (debug=profile): the
training loop marks its phases (data, host_to_device, forward, backward, optimizer, logging), and
the trace and a per-phase table are stored with the run as MLflow artifacts."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from seqlab.training.devices import synchronize

PHASES = ("data", "host_to_device", "forward", "backward", "optimizer", "logging")

_active = False  # set while a profiler runs: the phase marks cost nothing otherwise


def phase(name: str):
    """A profiler label around a phase of the step, or nothing when no profiler runs."""
    return torch.profiler.record_function(name) if _active else contextlib.nullcontext()


def _device_us(event: Any) -> float:
    for attribute in ("device_time_total", "cuda_time_total"):
        value = getattr(event, attribute, None)
        if value:
            return float(value)
    return 0.0


def phase_table(events: Any, wall_s: float, steps: int) -> str:
    """Per-phase CPU (and device) time, in total and per step, with its share of the wall time."""
    by_name = {e.key: e for e in events}
    lines = [
        f"profiled {steps} steps in {wall_s:.3f} s ({1000 * wall_s / max(steps, 1):.3f} ms a step)",
        f"{'phase':16} {'cpu ms':>9} {'ms/step':>9} {'% wall':>7} {'device ms':>10}",
    ]
    for name in PHASES:
        e = by_name.get(name)
        cpu_ms = (e.cpu_time_total / 1000) if e else 0.0
        dev_ms = (_device_us(e) / 1000) if e else 0.0
        lines.append(
            f"{name:16} {cpu_ms:9.2f} {cpu_ms / max(steps, 1):9.3f} {100 * cpu_ms / 1000 / max(wall_s, 1e-9):6.1f}% {dev_ms:10.2f}"
        )
    return "\n".join(lines)


class ProfileSteps(pl.Callback):
    """Profiles the first `steps` optimizer steps, then writes the trace and tables to
    `out_dir` and logs them to each member's run (a pack's step is every member's). steps=0: off."""

    def __init__(self, steps: int, out_dir: Path) -> None:
        self.steps = steps
        self.out_dir = Path(out_dir)
        self.profiler: Optional[torch.profiler.profile] = None
        self.paths: list[Path] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        global _active
        if self.steps <= 0:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.__enter__()
        _active = True
        self.first_step = trainer.global_step
        self.start = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.profiler is not None and trainer.global_step - self.first_step >= self.steps:
            self._finish(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.profiler is not None:
            self._finish(trainer, pl_module)

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        global _active

        synchronize(pl_module.device)
        wall = time.perf_counter() - self.start
        steps = trainer.global_step - self.first_step
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        _active = False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / "profile_trace.json"
        profiler.export_chrome_trace(str(trace))
        events = profiler.key_averages()
        phases = self.out_dir / "profile_phases.txt"
        phases.write_text(phase_table(events, wall, steps) + "\n")
        ops = self.out_dir / "profile_ops.txt"
        sort = "self_cuda_time_total" if pl_module.device.type == "cuda" else "self_cpu_time_total"
        ops.write_text(events.table(sort_by=sort, row_limit=30) + "\n")
        self.paths = [trace, phases, ops]
        for m in getattr(pl_module, "members", []):
            if m.run_open:
                with m.own_failure("its profile"):
                    for path in self.paths:
                        m.tracker.log_artifact(path, "profile")
