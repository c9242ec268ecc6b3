"""benchmark.roofline: a step's arithmetic and bytes, against the machine's measured peaks."""

from __future__ import annotations

import pytest
import torch

from seqlab.benchmark.roofline import (
    ADAM_FLOP,
    FLOAT,
    PARAMETER_PASSES,
    Peaks,
    fractions,
    measure_peaks,
    step_cost,
)
from seqlab.model import CNNLSTM

# The seed's network on its data: 1 step x 1440 features, 2 filters, 24 hidden units, batch 64.
SEED = dict(steps=1, features=1440, filters=2, kernel_size=5, hidden=24, outputs=1)


def _parameters() -> int:
    net = CNNLSTM(n_features=1440, n_outputs=1, filters=2, kernel_size=5, hidden_size=24)
    return sum(p.numel() for p in net.parameters())


def test_the_seed_steps_arithmetic_and_bytes_counted_by_hand():
    cost = step_cost(**SEED, parameters=_parameters(), batch=64)
    # Nothing to update where no gradient comes: the other four taps, the LSTM's recurrent weights.
    p = _parameters() - 4 * 2 * 1440 - 4 * 24 * 24
    conv = 2 * 64 * 1440 * 2  # the centre tap only: one step
    lstm = 2 * 64 * 4 * 24 * 2  # the input product; h0 = 0 leaves out the recurrent one
    fc = 2 * 64 * 24
    assert cost.flop == 3 * (conv + lstm + fc) - conv + ADAM_FLOP * p
    batch = 64 * 1440 * FLOAT
    activations = 2 * 64 * (2 + 5 * 24) * FLOAT
    assert cost.bytes == 4 * batch + PARAMETER_PASSES * p * FLOAT + activations


def test_a_shared_batch_moves_its_bytes_once_for_every_member_and_arithmetic_scales():
    p = _parameters()
    one = step_cost(**SEED, parameters=p, batch=64)
    own = step_cost(**SEED, parameters=p, batch=64, members=32)
    shared = step_cost(**SEED, parameters=p, batch=64, members=32, shared_batch=True)
    assert own.flop == shared.flop == 32 * one.flop
    batch_bytes = 4 * 64 * 1440 * FLOAT
    assert own.bytes - shared.bytes == 31 * batch_bytes


def test_fractions_of_the_peaks_and_the_peaks_measured_here():
    cost = step_cost(**SEED, parameters=_parameters(), batch=64)
    flop, moved = fractions(cost, 100.0, Peaks(cost.flop * 1000, cost.bytes * 400))
    assert flop == pytest.approx(0.1) and moved == pytest.approx(0.25)
    peaks = measure_peaks(torch.device("cpu"), repeats=1)
    # Any CPU this runs on does more than 0.1 GFLOP/s and copies more than 0.1 GB/s.
    assert peaks.flop_per_s > 1e8 and peaks.bytes_per_s > 1e8
