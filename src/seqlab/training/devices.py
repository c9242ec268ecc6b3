"""Which device a run uses, its human name, and honest synchronisation for timing."""

from __future__ import annotations

import platform
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch

from seqlab import SeqlabError


@dataclass(frozen=True)
class Device:
    accelerator: str  # lightning's name: cpu | gpu | mps
    name: str  # CPU model or GPU name
    torch_device: torch.device


def present() -> list[str]:
    found = ["cpu"]
    if torch.cuda.is_available():
        found.append(f"gpu ({torch.cuda.device_count()} x {torch.cuda.get_device_name(0)})")
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve(requested: str) -> Device:
    """Map trainer.accelerator to the device this run will use; fail with one clear line if the
    requested device is not present (never fall back silently: a sweep compares devices)."""
    requested = "gpu" if requested == "cuda" else requested
    if requested == "auto":
        if torch.cuda.is_available():
            requested = "gpu"
        elif torch.backends.mps.is_available():
            requested = "mps"
        else:
            requested = "cpu"
    if requested == "gpu":
        if not torch.cuda.is_available():
            cuda = torch.version.cuda or "none (CPU-only build)"
            raise SeqlabError(
                f"trainer.accelerator=gpu asked for a CUDA GPU, but this machine has only: "
                f"{', '.join(present())} (torch {torch.__version__}, CUDA {cuda}); "
                "use trainer.accelerator=cpu or auto"
            )
        return Device("gpu", torch.cuda.get_device_name(0), torch.device("cuda", 0))
    if requested == "mps":
        if not torch.backends.mps.is_available():
            raise SeqlabError(
                f"trainer.accelerator=mps asked for Apple's GPU, but this machine has only: "
                f"{', '.join(present())}; use trainer.accelerator=cpu or auto"
            )
        return Device("mps", "Apple MPS", torch.device("mps"))
    return Device("cpu", cpu_name(), torch.device("cpu"))


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a clock read after it measures work done, not queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextmanager
def torch_threads(threads: Optional[int]) -> Iterator[None]:
    """torch's CPU threads set to `threads` (None: left as they are) while inside, the process's
    own count given back after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def use_cores(
    device: Optional[Device], deterministic: bool, threads: Optional[int]
) -> Iterator[None]:
    """For a job: cuDNN's autotuner on a GPU unless the run must be deterministic; `threads`: the
    cores each of the job's processes takes (perf.threads, or its share beside the other jobs of a
    parallel launcher and its own DDP processes: sweeps.job.Job.cpu_share) instead of all of
    them, torch's default, which beside other processes oversubscribes the machine and slows
    every one down; None: torch's default (device None: a device that could not be had, whose
    error follows). The process's own thread count comes back after the job (a notebook's or a
    test's next run starts from it)."""
    if device is not None and device.accelerator == "gpu":
        torch.backends.cudnn.benchmark = not deterministic
    with torch_threads(threads):
        yield
