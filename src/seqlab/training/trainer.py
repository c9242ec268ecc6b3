"""Lightning's Trainer for every job, a run alone and a pack alike: conf/trainer/ through its
`_target_`, plus what the job decides (the device found, the validation interval in whole loop
calls, clipping inside the fused loop, how metrics leave the run)."""

from __future__ import annotations

from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint


def build_trainer(
    cfg: DictConfig,
    device,
    callbacks: list,
    logger: Any,
    fused: bool,
    has_val: bool,
    val_every: Any,
):
    """The job's Trainer. `logger`: False (each member's metrics go to its own run, from the module and
    the callbacks: seqlab.packing.module); `fused`: the loop steps the optimizer itself, and clips
    there."""
    node = OmegaConf.to_container(cfg.trainer, resolve=True)
    extra = node.pop("extra")
    decided = dict(
        accelerator=device.accelerator,
        gradient_clip_val=None if fused else cfg.trainer.gradient_clip_val,  # the loop clips itself
        check_val_every_n_epoch=cfg.trainer.check_val_every_n_epoch if has_val else 1,
        val_check_interval=val_every,
        deterministic=cfg.deterministic,
        log_every_n_steps=cfg.logger.flush_every_n_steps,
        enable_progress_bar=cfg.perf.progress == "bar",
        # Per-epoch checkpoints cost more than an epoch of this model: by default one, at the end.
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_model_summary=False,
        default_root_dir=cfg.paths.output_dir,
    )
    if not has_val:
        decided["limit_val_batches"] = 0
    try:
        return instantiate({**node, **decided, **extra}, callbacks=callbacks, logger=logger)
    except InstantiationException as error:  # Lightning's own error says which argument
        raise (error.__cause__ or error) from None
