"""What a training run says about itself in MLflow: its name (what differs: cpu-bs64,
gpu-bs256-optimizer=sgdm), its tags (versions, device, host, overrides, git commit, its sweep and
trial), its params (every resolved key, masked) and its config as config.yaml."""

from __future__ import annotations

import hashlib
import json
import socket
from typing import Any, Optional

import mlflow
import pytorch_lightning
import torch
from omegaconf import DictConfig, OmegaConf

from seqlab.resume.requeue import scheduler_tags
from seqlab.secrets import mask_flat
from seqlab.sweeps.job import Job, SweepInfo
from seqlab.sweeps.trial import trial_tags
from seqlab.sweeps.verdict import NOT_CONFIG
from seqlab.tracking.omegaconf_private import config_yaml
from seqlab.tracking.provenance import CodeState, record_provenance
from seqlab.tracking.run import flatten

# Overrides already shown by the first part of a run name, or that say where, not what.
_NAME_SKIP = ("trainer.accelerator", "data.batch_size", "logger.", "paths.", "hydra.")


def run_name(
    accelerator: str, cfg: DictConfig, overrides: list[str], swept: Optional[list[str]] = None
) -> str:
    """Names say what differs: cpu-bs64, gpu-bs256-optimizer=sgdm, ... In a sweep, only the
    swept keys count (what differs between its runs); in a single run, every override."""
    parts = [accelerator, f"bs{cfg.data.batch_size}"]
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if swept is not None and key not in swept:
            continue
        if not key.startswith(_NAME_SKIP) and key not in _NAME_SKIP:
            parts.append(f"{key.split('.')[-1]}={value}")
    return "-".join(parts)[:250]


# What repeats of one configuration differ in (data.seed follows seed in the presets).
REPEAT_KEYS = ("seed", "data.seed")


def config_tag(
    accelerator: str,
    cfg: DictConfig,
    params: dict[str, str],
    overrides: list[str],
    swept: Optional[list[str]] = None,
) -> str:
    """The `config` tag: the same for every repeat of one configuration (runs that differ only in
    REPEAT_KEYS), so that the MLflow UI's "Group by" tags.config shows each configuration's
    mean and spread as compare.py does: the run's name without the repeat keys, and a short hash
    of every param (`params`: run_params's) that makes the configuration (not where it was
    stored or logged)."""
    params = {
        k: v for k, v in params.items() if k not in REPEAT_KEYS and not k.startswith(NOT_CONFIG)
    }
    digest = hashlib.sha1(json.dumps([accelerator, sorted(params.items())]).encode()).hexdigest()[
        :8
    ]
    kept = [o for o in overrides if o.lstrip("+~").partition("=")[0] not in REPEAT_KEYS]
    return f"{run_name(accelerator, cfg, kept, swept)} #{digest}"


def run_tags(
    cfg: DictConfig, job: Job, device, sweep: SweepInfo, code: CodeState, params: dict[str, str]
) -> dict[str, str]:
    """The run's tags; `params`: its run_params (the config tag hashes them)."""

    tags = {
        "accelerator_requested": cfg.trainer.accelerator,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "none",
        "lightning_version": pytorch_lightning.__version__,
        "mlflow_version": mlflow.__version__,
        "host": socket.gethostname(),
        "hydra_overrides": " ".join(job.overrides),
        "data": cfg.data.name,
        "mlflow.source.name": "train.py",
        "mlflow.source.type": "LOCAL",
    }
    if device is not None:
        tags.update(accelerator=device.accelerator, device_name=device.name)
    tags["config"] = config_tag(
        device.accelerator if device else cfg.trainer.accelerator,
        cfg,
        params,
        job.overrides,
        sweep.swept_keys,
    )
    tags.update(
        scheduler_tags()
    )  # a SLURM job's id and start: a requeued job finds its run by them
    tags.update(code.tags())  # git_commit, git_dirty, code_digest (provenance.py)
    if cfg.get("rerun"):  # made again from that run's record (seqlab.rerun)
        tags.update(rerun_of=str(cfg.rerun), rerun_code=str(cfg.rerun_code))
    if job.multirun:
        tags.update(sweep_id=sweep.sweep_id or job.sweep_dir.name, job_num=str(job.num))
        tags.update(trial_tags())  # a search's trial: its study, number and state
    return tags


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config with every interpolation resolved, as OmegaConf.to_yaml(resolve=True) writes it:
    once a run, for its params and its config.yaml (resolving took a third of their time)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def run_params(cfg: DictConfig, config: dict[str, Any]) -> dict[str, str]:
    """Every resolved key (`config`: resolved's) as an MLflow param, masked (so that resume=
    compares like with like), except a callback's folder: made from paths.output_dir, it differs
    from job to job and would make repeats of one configuration look like different ones
    (paths.output_dir says it once)."""
    raw = flatten(OmegaConf.to_container(cfg, resolve=False))
    return mask_flat(
        {
            k: v
            for k, v in flatten(config).items()
            if not (k.startswith("callbacks.") and "${paths." in raw.get(k, ""))
        }
    )


def record_config(
    job: Job, tracker, params: dict, config: dict[str, Any], continued: bool, code: CodeState
) -> None:
    """The params (a new run's: a `continued` run has them, and MLflow keeps a param's first value)
    and the resolved config (`config`: resolved's) as config.yaml."""
    if not continued:
        with tracker.costs.phase("params and config"):
            tracker.log_params(params)
        with tracker.costs.phase("code and environment"):
            record_provenance(tracker, code, job.output_dir)  # code/ and env/: how it was made
    with tracker.costs.phase("params and config"):
        path = job.output_dir / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_yaml(config))
        tracker.log_artifact(path)
