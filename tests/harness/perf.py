"""What the tests in `integration/test_perf.py` and `unit/training/test_loop.py` share (under
tests/)."""

from __future__ import annotations

import torch

# -- CUDA graphs: the logic on a CPU, the real thing where CUDA exists --------------------------


def _eager_capture(step, inputs, replays=None):
    """Stands in for CUDA capture on a CPU: like a capture, it runs nothing; 'replay' runs the
    step on the static inputs and writes into the same output tensors, as a replayed graph does
    (and counts itself in `replays`)."""
    outputs = (torch.empty(0), torch.empty(0))

    def replay():
        if replays is not None:
            replays.append(1)
        for static, fresh in zip(outputs, step(*inputs)):
            static.resize_as_(fresh).copy_(fresh.detach())

    return replay, outputs
