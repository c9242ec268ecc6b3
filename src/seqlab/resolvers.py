"""The config's own resolvers (`${seqlab_...:}` in conf/), registered when seqlab.schema is
imported, before Hydra composes. Light: they run while the CLI composes, before torch loads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def accelerators_present() -> str:
    """'cpu', or 'cpu,gpu' where an NVIDIA GPU is visible: a sweep value, found without
    importing torch (this runs while Hydra composes)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    has_gpu = Path("/dev/nvidia0").exists() and visible not in ("", "-1")
    has_gpu = has_gpu or (shutil.which("nvidia-smi") is not None and Path("/proc/driver/nvidia/gpus").is_dir())
    return "cpu,gpu" if has_gpu else "cpu"


def gpus_per_node(accelerator: str, devices: Any) -> int:
    """The GPUs a cluster job asks for on each node: none for CPU training (a partition without
    GPUs would never start a job that asks for one), else one per device the trainer uses."""
    if accelerator == "cpu":
        return 0
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices)
    return int(devices) if str(devices).isdigit() else 1  # "auto": one


def register() -> None:
    OmegaConf.register_new_resolver("seqlab_accelerators", accelerators_present, replace=True)
    OmegaConf.register_new_resolver("seqlab_gpus_per_node", gpus_per_node, replace=True)
    # Random digits after the second in Hydra's folders (runs started in the same second get their
    # own); cached as Hydra's `now`: one value per composed config, copied into a sweep's jobs.
    OmegaConf.register_new_resolver("seqlab_unique", lambda: os.urandom(3).hex(), replace=True, use_cache=True)
