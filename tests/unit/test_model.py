"""The CNN-LSTM, its initialisations, and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from seqlab.model import CNNLSTM
from seqlab.training.evaluation import half_mse


@pytest.mark.parametrize("steps, features", [(1, 1440), (3, 1440), (1440, 1)])
def test_output_is_one_value_per_sample(steps, features):
    model = CNNLSTM(n_features=features)
    out = model(torch.randn(4, steps, features))
    assert out.shape == (4, 1)


def test_layers_match_the_matlab_network():
    model = CNNLSTM(n_features=1440)
    assert (model.conv.in_channels, model.conv.out_channels, model.conv.kernel_size) == (
        1440,
        2,
        (5,),
    )
    assert model.bn.num_features == 2 and model.bn.eps == 1e-5
    assert (model.lstm.input_size, model.lstm.hidden_size) == (2, 24)
    assert model.drop.p == 0.1
    assert (model.fc.in_features, model.fc.out_features) == (24, 1)


def test_half_mse_is_half_the_sum_over_responses_averaged_over_the_batch():
    pred = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    target = torch.zeros(2, 2)
    # 0.5 * mean(1 + 4, 9 + 0) = 0.5 * 7
    assert half_mse(pred, target).item() == pytest.approx(3.5)


def test_pytorch_init_is_pytorchs_default():
    torch.manual_seed(0)
    model = CNNLSTM(n_features=1440, init="pytorch")
    bound = 1 / math.sqrt(24)
    assert model.lstm.weight_hh_l0.abs().max().item() <= bound
    assert torch.count_nonzero(model.lstm.bias_hh_l0) > 0


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN"
)
def test_the_lstm_over_many_steps_runs_in_onednns_kernel_on_a_cpu():
    """The 1440-step shape is bound by the LSTM: its steps must run inside oneDNN's fused LSTM
    (one call for the whole sequence, forward and backward), not step by step in PyTorch."""
    model = CNNLSTM(1)
    x = torch.randn(4, 50, 1)
    with torch.profiler.profile() as prof:
        model(x).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert {"aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"} <= names
