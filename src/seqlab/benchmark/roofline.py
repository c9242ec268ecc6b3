"""Whether a benchmark row is bound by arithmetic, by memory or by neither (kernel launches and
Python): each training step's arithmetic (FLOP) and the bytes it must move at the least, counted
from the network's shape, set against this machine's measured peak of each (a large matrix
product and a large copy, timed here). A row far below both peaks is bound by launches: what
packing answers (issue 35, point 4; the seed's question of why a GPU trains this network no faster
than a CPU).

The counts are a floor, not a trace: the products of the forward pass, their backward (the
weights' gradients, and the inputs' gradients but for the data's), Adam's update, the batch
gathered, read by the forward and again by the weights' gradient, and each parameter's reads and
writes (the weight, its gradient, Adam's two moments)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from hydra.utils import instantiate

FLOAT = 4  # bytes: fp32 throughout
ADAM_FLOP = 12  # per parameter and step: the moments, the bias corrections, the update
PARAMETER_PASSES = 9  # a parameter's reads and writes a step: weight, gradient, Adam's m and v


@dataclass
class Peaks:
    """What this machine's device does at best, measured: fp32 arithmetic and memory traffic."""

    flop_per_s: float  # a large fp32 matrix product
    bytes_per_s: float  # a large copy (read + write)


@dataclass
class StepCost:
    flop: float
    bytes: float


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up: allocation, the library's first call
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_peaks(device: torch.device, repeats: int = 5) -> Peaks:
    """A matrix product of n x n (n = 1024 on a CPU, 4096 on a GPU) and a copy of 256 MB, medians."""
    n = 4096 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    matmul_s = _timed(lambda: torch.mm(a, b), device, repeats)
    src = torch.empty(64 * 2**20, device=device).fill_(1.0)  # 64 Mi floats: 256 MB
    dst = torch.empty_like(src)
    copy_s = _timed(lambda: dst.copy_(src), device, repeats)
    return Peaks(2 * n**3 / matmul_s, 2 * src.numel() * FLOAT / copy_s)


def step_cost(
    steps: int,
    features: int,
    filters: int,
    kernel_size: int,
    hidden: int,
    outputs: int,
    parameters: int,
    batch: int,
    members: int = 1,
    shared_batch: bool = False,
) -> StepCost:
    """One optimizer step of `members` CNN-LSTMs (conv1d -> BatchNorm -> LSTM, last step -> fc) on
    a batch of (batch, steps, features) each; shared_batch: one batch for all of them (one data
    order). A one-step sample needs only the convolution's centre tap and the LSTM's first step."""
    taps = 1 if steps == 1 else kernel_size
    # What the optimizer must update: one-step data leaves the other taps and the LSTM's
    # recurrent weights without a gradient (a pack leaves them out of its step where nothing
    # decays them: PackedCNNLSTM.freeze_unused).
    parameters -= (kernel_size - taps) * filters * features + (
        4 * hidden * hidden if steps == 1 else 0
    )
    conv = 2 * batch * steps * features * filters * taps
    lstm = 2 * batch * 4 * hidden * (steps * filters + (steps - 1) * hidden)
    fc = 2 * batch * hidden * outputs
    forward = conv + lstm + fc
    # Backward: each product's weight gradient and its input gradient, but the data's.
    flop = members * (3 * forward - conv + ADAM_FLOP * parameters)
    batch_bytes = batch * steps * features * FLOAT
    # Gathered (read and written), read by the forward and by the convolution's weight gradient.
    inputs = 4 * batch_bytes * (1 if shared_batch else members)
    weights = members * PARAMETER_PASSES * parameters * FLOAT
    # Each layer's output, written by the forward and read by the backward.
    activations = members * 2 * batch * steps * (filters + 5 * hidden) * FLOAT
    return StepCost(float(flop), float(inputs + weights + activations))


def fractions(cost: StepCost, steps_per_s: float, peaks: Peaks) -> tuple[float, float]:
    """The share of the machine's peak arithmetic and memory traffic that `steps_per_s` steps of
    `cost` a second use."""
    return cost.flop * steps_per_s / peaks.flop_per_s, cost.bytes * steps_per_s / peaks.bytes_per_s


def config_step_cost(cfg, batch_size: int, members: int, shared_batch: bool) -> StepCost:
    """The step of `members` networks of a composed training config (step_cost), its data's shape
    from its source: `layout: profile` is (days x features) steps of one feature."""
    source = cfg.data.source
    days, features = source.get("seq_len", 1), source.get("n_features", 1440)
    steps, features = (
        (days * features, 1) if source.get("layout") == "profile" else (days, features)
    )
    network = instantiate(cfg.model, n_features=features, n_outputs=1)
    return step_cost(
        steps,
        features,
        cfg.model.filters,
        cfg.model.kernel_size,
        cfg.model.hidden_size,
        1,
        sum(p.numel() for p in network.parameters()),
        batch_size,
        members,
        shared_batch,
    )
