"""The fast path: the same numbers as a plain PyTorch loop, on-device batching, no host
synchronisation in the hot loop, and the benchmark script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hydra.utils import instantiate

from conftest import ROOT, runs_of
from seqlab.module import half_mse
from seqlab.train import train


def _plain_losses(cfg, n_steps: int) -> list[float]:
    """A hand-written loop over the same data in the same order, from the same initial weights."""
    import pytorch_lightning as pl

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    model = instantiate(cfg.model, n_features=dm.n_features, n_outputs=dm.n_outputs)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimizer.lr)
    dm.configure_batching(cfg.perf.loader, on_device=False, batches_per_item=1)
    batches = dm.train_dataloader()  # the same order the perf option trains in
    losses = []
    while len(losses) < n_steps:
        for xb, yb in batches:
            optimizer.zero_grad()
            loss = half_mse(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == n_steps:
                break
    return losses


@pytest.mark.parametrize("perf", ["fast", "naive"])
def test_the_training_loop_computes_what_a_plain_loop_computes(compose_cfg, store, perf):
    cfg = compose_cfg(f"perf={perf}", "data.n_samples=700", "trainer.max_epochs=3", "scheduler=none",
                      "perf.checkpoint_every_n_epochs=0")
    train(cfg)
    (run,) = runs_of(store, "seqlab")
    recorded = [m.value for m in store.get_metric_history(run.info.run_id, "train_loss")]
    assert len(recorded) == 27  # 560 training samples: 9 batches an epoch (the last one partial)
    expected = _plain_losses(cfg, len(recorded))
    assert recorded == pytest.approx(expected, rel=2e-4, abs=1e-6)
