"""The default training loop (perf=fast), in one place, for every job: a run alone is a pack of
one (seqlab.packing.model.OneMember), a pack K members of one packed network.

Lightning calls `SeqRegressor.training_step` once per item of `perf.steps_per_call` mini-batches;
the module hands the item's batches to `FusedLoop.run_batches`, which runs their optimizer steps
itself, as a bare PyTorch loop would:

    zero the gradients -> forward (K, batch) -> each member's loss -> backward of their sum
    -> L2 and threshold (per member) -> clip -> update

Everything Lightning would do per step (closures, hooks, progress counters, logging) is paid
once per item instead; nothing in the loop reads a value back to the host, so a GPU never
waits. What a step leaves behind is a reference to its (K,) losses (the step log, sent to each
member's run by `tracking.StepMetricsRecorder` between items) and to its predictions (the epoch's
train metrics, computed once at the epoch's end). `scripts/benchmark.py` holds this loop to a bare
loop of the same math (its `bare` row).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

import torch
from pytorch_lightning.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from seqlab.training.cudagraph import GraphedStep
from seqlab.training.perf import DirectFusedStep
from seqlab.training.profiling import phase

log = logging.getLogger("seqlab")


def gradient_buffers(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """Every trainable parameter's gradient tensor, made as zeros where missing (Lightning may free
    them around validation, and as it starts fitting), then zeroed in place each step, so a captured
    graph's stay live and parameters the one-step shortcut leaves unused still get their (zero)
    gradient, L2 term and optimizer update. The fused loop's and a pack's (packing.module)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]


Batch = tuple[
    torch.Tensor, torch.Tensor, Optional[torch.Tensor]
]  # inputs, targets, sequence lengths: each (K, batch, ...)


def lightning_steps(module: Any) -> dict[str, Callable]:
    """How the loop steps: in full precision on one device, Lightning's optimizer wrapper and
    manual_backward add only hooks this project does not use, so the loop calls the raw optimizer
    and a plain backward, and the module counts its steps ({}). A precision plugin that scales
    the loss or casts (16/bf16-mixed), or a strategy of many devices, must see both: then the loop
    goes through Lightning's, which count the steps themselves."""
    trainer = module.trainer
    # Under DDP the loop averages the gradients itself (seqlab.ddp.gradients): Lightning's
    # backward would hand them to DDP's reducer.
    plain = str(trainer.precision) in ("32-true", "32", "64-true") and isinstance(
        trainer.strategy, (SingleDeviceStrategy, DDPStrategy)
    )
    return (
        {}
        if plain
        else {"optimizer_step": module.optimizers().step, "backward": module.manual_backward}
    )


class FusedLoop:
    """Runs the optimizer steps of one item for a network of K >= 1 members (its `n_members`: its
    model takes and returns the member dimension first, its loss gives each member's, and the
    backward of their sum gives member k's parameters member k's gradient alone). Built by the
    module when training starts (the optimizer exists only then), from the perf settings bound in
    seqlab.train:

    - `cuda_graph`: auto | on | off: replay each full step as one CUDA graph (seqlab.training.cudagraph).
    - `gradients`: MATLAB's L2 and threshold and trainer.gradient_clip_val, per member (Lightning
      clips only in automatic optimisation).
    - `optimizer_step` / `backward`: the raw optimizer's step and a plain backward, unless the
      precision plugin must see them (`lightning_steps`): then Lightning's, which count the step
      themselves (`counts_steps`).
    - `dropout_streams`: a pack's members' CPU dropout generators (each its run alone's stream).
    - `average_gradients`: under DDP, each step's gradients averaged over the processes after the
      backward (seqlab.ddp.gradients), as DDP's reducer would.
    - `after_step`: run after each step, outside any graph (the step counted; a pack puts its
      frozen members back).

    The loop calls the network's `forward` itself rather than the module (`model(...)`):
    nn.Module's __call__ only dispatches hooks, and none is registered on the loop's network
    (OneMember and PackedCNNLSTM are this project's own wrappers; DDP's and Lightning's sit on the
    modules around it). On this project's 2-core VM that dispatch was 10 us of a 590-us step at
    batch 64, the largest single cost of this loop over the bare loop of its math
    (benchmark.loops.bare_loop). The network's own layers are still called as modules."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        step_log: Any,
        batch_size: int,
        gradients: Optional[Any] = None,
        cuda_graph: str = "auto",
        optimizer_step: Optional[Callable[[], Any]] = None,
        backward: Optional[Callable[[torch.Tensor], None]] = None,
        dropout_streams: Optional[list[torch.Generator]] = None,
        after_step: Optional[Callable[[], None]] = None,
        average_gradients: Optional[Callable[[list[torch.Tensor]], None]] = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.step_log = step_log
        self.batch_size = batch_size
        self.gradients = gradients if gradients is not None and gradients.active else None
        self.dropout_streams, self.after_step = dropout_streams, after_step
        self.forward = model.forward  # without __call__'s hook dispatch (the docstring says why)
        self.average_gradients = average_gradients
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.counts_steps = optimizer_step is not None  # Lightning's step counts itself
        self.optimizer_step = optimizer_step or (
            DirectFusedStep(optimizer) if DirectFusedStep.applies(optimizer) else optimizer.step
        )
        self.backward = backward or torch.Tensor.backward
        self.grads = gradient_buffers(self.params)
        self.ones = torch.ones(model.n_members, device=self.params[0].device)
        self.epoch_preds: list[torch.Tensor] = []
        self.epoch_targets: list[torch.Tensor] = []
        self.graphed = self._graphed_step(str(cuda_graph).lower())

    def _graphed_step(self, cuda_graph: str):
        asked = cuda_graph in ("on", "true")
        if not asked and cuda_graph != "auto":
            return None
        device = self.params[0].device
        capturable = all(group.get("capturable", False) for group in self.optimizer.param_groups)
        if device.type == "cuda" and not self.counts_steps and capturable:
            return GraphedStep(self.step, self.batch_size, batch_dim=1)
        if asked:
            log.warning(
                "perf      perf.cuda_graph=on needs one CUDA device, full precision and a capturable "
                "optimizer (Adam, AdamW): training eagerly"
            )
        return None

    def run_batches(self, batches: Iterable[Batch], first_step: int) -> tuple[int, torch.Tensor]:
        """One optimizer step per batch, each (K, batch, ...), numbered from `first_step`. Returns
        how many ran and the last step's (K,) losses (a device tensor)."""
        self.grads = gradient_buffers(self.params)  # the same tensors unless Lightning freed them
        lr = self.optimizer.param_groups[0]["lr"]  # a scheduler changes it only between epochs
        if isinstance(
            lr, torch.Tensor
        ):  # CUDA graphs: updated in place; the log keeps this call's value
            lr = lr.detach().clone()
        loss, n = None, 0
        for xb, yb, lb in batches:
            out = self.graphed(xb, yb, lb) if self.graphed is not None else None
            loss, pred = out if out is not None else self.step(xb, yb, lb)
            if self.after_step is not None:
                self.after_step()
            # References only: the values are read back together when the log is flushed, and
            # the predictions folded into the epoch's metrics once, at the epoch's end.
            self.step_log.add(loss.detach(), first_step + n, lr)
            self.epoch_preds.append(pred.detach())
            self.epoch_targets.append(yb)
            n += 1
        return n, (
            loss.detach() if loss is not None else torch.zeros(1, device=self.params[0].device)
        )

    def step(
        self, x: torch.Tensor, y: torch.Tensor, lengths: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One iteration as MATLAB orders it: loss, backward, L2 and threshold, update."""
        torch._foreach_zero_(self.grads)
        with phase("forward"):
            pred = self.forward(x, self.dropout_streams, lengths)  # (K, batch, outputs)
            loss = self.loss_fn(pred, y)  # (K,)
        with phase("backward"):
            # The backward of the members' summed losses (a gradient of ones for each member's,
            # without a sum in the step): member k's parameters get member k's loss's gradient.
            if self.ones.dtype != loss.dtype:  # trainer.precision=64-true: a double loss
                self.ones = torch.ones_like(loss)
            self.backward(loss, self.ones)
            if self.average_gradients is not None:
                self.average_gradients(self.grads)
        with phase("optimizer"):
            # Through Lightning's optimizer (mixed precision), the treatment runs inside its step,
            # after the gradients are unscaled (SeqRegressor.on_before_optimizer_step).
            if self.gradients is not None and not self.counts_steps:
                self.gradients()
            self.optimizer_step()
        return loss, pred

    def take_epoch(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's predictions and targets so far, (K, samples, outputs) each (None if none)."""
        if not self.epoch_preds:
            return None
        preds, targets = torch.cat(self.epoch_preds, 1), torch.cat(self.epoch_targets, 1)
        self.epoch_preds, self.epoch_targets = [], []
        return preds, targets
