"""The config's own resolvers (`${seqlab_...:}` in conf/), registered when seqlab.schema is
imported, before Hydra composes. Light: they run while the CLI composes, before torch loads."""

from __future__ import annotations

import inspect
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
    has_gpu = has_gpu or (
        shutil.which("nvidia-smi") is not None and Path("/proc/driver/nvidia/gpus").is_dir()
    )
    return "cpu,gpu" if has_gpu else "cpu"


def gpus_per_node(accelerator: str, devices: Any) -> int:
    """The GPUs a cluster job asks for on each node: none for CPU training (a partition without
    GPUs would never start a job that asks for one), else one per device the trainer uses."""
    if accelerator == "cpu":
        return 0
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices)
    return int(devices) if str(devices).isdigit() else 1  # "auto": one


def _register(name: str, resolver: Any, use_cache: bool = False) -> None:
    # OmegaConf 2.4 (Hydra 1.4's) calls it register_resolver and warns on register_new_resolver;
    # 2.3's register_resolver is the old API of another meaning (no replace=), which 2.4 renames legacy_.
    if "replace" in inspect.signature(OmegaConf.register_resolver).parameters:
        OmegaConf.register_resolver(name, resolver, replace=True, use_cache=use_cache)
    else:
        OmegaConf.register_new_resolver(name, resolver, replace=True, use_cache=use_cache)


def register() -> None:
    _register("seqlab_accelerators", accelerators_present)
    _register("seqlab_gpus_per_node", gpus_per_node)
    # Random digits after the second in Hydra's folders (runs started in the same second get their
    # own); cached as Hydra's `now`: one value per composed config, copied into a sweep's jobs.
    _register("seqlab_unique", lambda: os.urandom(3).hex(), use_cache=True)
