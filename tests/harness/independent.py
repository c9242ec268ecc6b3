"""What seqlab records, computed again here without its code: a recorded number is checked
against these, not against another copy of itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate


def _data(cfg):
    dm = instantiate(cfg.data)
    dm.setup("fit")
    return dm


def baseline_rmse(cfg) -> float:
    """RMSE on the validation set of always predicting the training targets' mean."""
    dm = _data(cfg)
    mean = dm.train.y.astype(np.float64).mean(axis=0)
    return float(np.sqrt(((dm.val.y.astype(np.float64) - mean) ** 2).mean()))


def val_rmse_of_checkpoint(cfg, checkpoint: Path) -> float:
    """RMSE on the validation set of the network a checkpoint holds: a fresh model of the config's
    shape, the checkpoint's weights (BatchNorm statistics included), eval mode, plain arithmetic."""
    dm = _data(cfg)
    model = instantiate(cfg.model, n_features=dm.n_features, n_outputs=dm.n_outputs)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(
        {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    )
    model.eval()
    squared, count = 0.0, 0
    with torch.no_grad():
        for x, y, *lengths in dm.val_dataloader():
            pred = model(x, *lengths) if lengths else model(x)
            squared += float(((pred.double() - y.double()) ** 2).sum())
            count += y.numel()
    return (squared / count) ** 0.5
