"""A loss that became NaN or Inf ends its member's training at once, with the step it happened
at: a run alone's job fails with that line; a pack's other members train on."""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl

from seqlab import SeqlabError

DIVERGED = (
    "the training loss became {value} at step {step}: training diverged; lower optimizer.lr, "
    "set module.gradient_threshold, or check the data"
)


class Diverged(SeqlabError):
    """The loss became NaN or Inf."""


class DivergenceCheck(pl.Callback):
    """Looks at the train_loss values the step recorder has read back into each member's run
    history (it reads them anyway, so this costs no synchronisation): a divergence stops that member
    within one send interval (logger.flush_every_n_steps, flush_every_s), FAILED with the step
    (Member.fail); training stops once no member trains. Placed after the recorder in the
    callbacks."""

    def __init__(self) -> None:
        # member (by identity: a refilled slot holds another) -> train_loss points looked at
        self.seen: dict[int, int] = {}

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.check(trainer, pl_module)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.check(trainer, pl_module)  # the recorder has just sent every step before it

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for m in pl_module.members:
            if m.status == "FAILED" or m.tracker is None:
                continue
            points = m.tracker.history.get("train_loss", [])
            new, self.seen[id(m)] = points[self.seen.get(id(m), 0) :], len(points)
            bad = next(((step, v) for step, v in new if not math.isfinite(v)), None)
            if bad is not None:
                # The run's step (its own: a refilled slot's counts from 1), the pack's for the member.
                m.fail(DIVERGED.format(value=bad[1], step=bad[0]), bad[0] + m.start_step)
        pl_module.members_stopped(trainer)
