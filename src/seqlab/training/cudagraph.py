"""One training step (zeroing gradients, forward, loss, backward, gradient treatment, optimizer
update) captured as a CUDA graph and replayed: one launch instead of the 60-150 kernels this
model's step takes, each of which costs the CPU 5-20 us to launch. Inputs go through static
buffers; the learning rate is a tensor on the device so a scheduler still applies after capture.

The first steps run eagerly on a side stream (CUDA's warm-up before capture); a batch of another
size (the last partial batch) runs eagerly; if capture fails, training goes on eagerly after one
warning line. Replaying computes what the eager step computes, on the same tensors."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from seqlab import one_line

log = logging.getLogger("seqlab")

Step = Callable[
    [torch.Tensor, torch.Tensor, Optional[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]
]


def capture_cuda(
    step: Step, inputs: tuple
) -> tuple[Callable[[], None], tuple[torch.Tensor, torch.Tensor]]:
    """Record `step` on `inputs` as a CUDA graph (nothing runs yet); returns (replay, outputs)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*inputs)
    return graph.replay, outputs


def warm_up_cuda(step: Step, inputs: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `step` eagerly on a side stream, as CUDA requires before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = step(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    return out


class GraphedStep:
    def __init__(
        self,
        step: Step,
        batch_size: int,
        warmup_steps: int = 3,
        capture=capture_cuda,
        warm_up=warm_up_cuda,
        batch_dim: int = 0,
    ) -> None:
        self.step = step  # the eager step on the raw optimizer: returns (loss, pred)
        self.batch_size = batch_size  # only full batches are graphed; a partial one runs eagerly
        self.batch_dim = batch_dim  # 1 for a pack's (K, batch, ...) inputs
        self.warmup_steps = warmup_steps
        self.capture, self.warm_up = (
            capture,
            warm_up,
        )  # replaceable, so the logic is testable on a CPU
        self.seen = 0
        self.graph: Optional[Callable[[], None]] = None  # replays the captured step
        self.failed = False
        self.static: tuple[Optional[torch.Tensor], ...] = ()
        self.outputs: tuple[torch.Tensor, torch.Tensor] = ()

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, lengths: Optional[torch.Tensor]
    ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(loss, pred) of this step, taken in the graph; None when the caller must run it eagerly."""
        if self.failed or x.shape[self.batch_dim] != self.batch_size:
            return None
        if self.graph is None:
            self.seen += 1
            if self.seen <= self.warmup_steps:
                return self.warm_up(self.step, (x, y, lengths))
            try:
                self.static = (x.clone(), y.clone(), None if lengths is None else lengths.clone())
                self.graph, self.outputs = self.capture(self.step, self.static)
                log.info(
                    "perf      training step captured as a CUDA graph (batch %d)", self.batch_size
                )
            except Exception as error:  # any capture failure: eager is always correct
                self.failed = True
                log.warning(
                    "perf      CUDA graph capture failed (%s): training eagerly", one_line(error)
                )
                return None
        static_x, static_y, static_lengths = self.static
        if x.shape != static_x.shape:  # e.g. another padded length
            return None
        static_x.copy_(x)
        static_y.copy_(y)
        if static_lengths is not None:
            static_lengths.copy_(lengths)
        self.graph()
        loss, pred = self.outputs
        return loss.clone(), pred.clone()  # the static outputs are overwritten by the next replay
