"""The CNN-LSTM of the MATLAB seed as a plain nn.Module, and its two weight initialisations.

Input (batch, steps, features) -> Conv1d along time (features are channels, 'same' padding)
-> BatchNorm1d -> ReLU -> LSTM, last step -> Dropout -> Linear.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from seqlab.schema import Init, choice
from seqlab.schema import ModelConfig as _Defaults


class CNNLSTM(nn.Module):
    def __init__(
        self,
        n_features: int,
        n_outputs: int = 1,
        filters: int = _Defaults.filters,
        kernel_size: int = _Defaults.kernel_size,
        hidden_size: int = _Defaults.hidden_size,
        dropout: float = _Defaults.dropout,
        init: str = _Defaults.init,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(n_features, filters, kernel_size, padding="same")
        self.bn = nn.BatchNorm1d(filters, eps=1e-5, momentum=0.1)
        self.relu = nn.ReLU()
        self.lstm = nn.LSTM(filters, hidden_size, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(hidden_size, n_outputs)
        if choice(Init, init, "model.init") == Init.matlab:
            init_matlab_(self)

    def forward(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (batch, steps, features); lengths: real steps of right-padded sequences, if any."""
        h = self.conv(x.transpose(1, 2))  # (B, filters, steps)
        h = self.relu(self.bn(h))
        out, _ = self.lstm(h.transpose(1, 2))  # (B, steps, hidden)
        if lengths is None:
            last = out[:, -1]
        else:
            # The LSTM is causal: its output at a sequence's last real step does not see the
            # padding after it. (MATLAB's 'last' with right padding takes the padded end.)
            last = out[torch.arange(len(out), device=out.device), lengths.to(out.device) - 1]
        return self.fc(self.drop(last))

    def forward_one_step(self, x: torch.Tensor) -> torch.Tensor:
        """The same function for a single step, in fewer and larger operations (the training
        loop takes it for one-step data, perf.exact_shortcuts; seqlab.training.loop):
        - with one step and 'same' padding, every convolution tap but one only ever multiplies
          the zero padding, so the convolution is a linear map through that one tap;
        - an LSTM step from a zero state has no recurrent term and no forget-gate term:
          c = sigmoid(i) * tanh(g), h = sigmoid(o) * tanh(c).
        Gradients are the same too (the skipped terms have zero gradient either way)."""
        tap = (self.conv.kernel_size[0] - 1) // 2  # the tap that sees step t itself
        # The tap copied out first: a strided slice (every kernel_size-th value) made the product
        # and its backward 0.40 ms a step at batch 64 here, against 0.29 ms from a copy.
        h = F.linear(x, self.conv.weight[:, :, tap].contiguous(), self.conv.bias)  # (B, filters)
        h = self.relu(self.bn(h))
        lstm = self.lstm
        bias = None if lstm.bias_ih_l0 is None else lstm.bias_ih_l0 + lstm.bias_hh_l0
        i, _, g, o = F.linear(h, lstm.weight_ih_l0, bias).chunk(4, dim=1)
        c = torch.sigmoid(i) * torch.tanh(g)
        return self.fc(self.drop(torch.sigmoid(o) * torch.tanh(c)))


@torch.no_grad()
def init_matlab_(model: CNNLSTM) -> None:
    """MATLAB's initialisers for this network (see docs in the shared MATLAB notes):
    conv 'he' N(0, 2/(kernel*channels)); LSTM input/recurrent 'He' N(0, 2/InputSize) and
    N(0, 2/NumHiddenUnits); one 'unit-forget-gate' bias (PyTorch has two: the second stays 0);
    fully connected Glorot-uniform; every other bias zero."""
    conv = model.conv
    fan_in = conv.in_channels * conv.kernel_size[0]
    nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / fan_in))
    nn.init.zeros_(conv.bias)
    lstm = model.lstm
    hidden = lstm.hidden_size
    nn.init.normal_(lstm.weight_ih_l0, 0.0, math.sqrt(2.0 / lstm.input_size))
    nn.init.normal_(lstm.weight_hh_l0, 0.0, math.sqrt(2.0 / hidden))
    nn.init.zeros_(lstm.bias_ih_l0)
    nn.init.zeros_(lstm.bias_hh_l0)
    lstm.bias_ih_l0[hidden : 2 * hidden] = 1.0  # gate order i, f, g, o: the forget gate
    # MATLAB's LSTM has one bias; PyTorch adds bias_ih and bias_hh. Trained together they would
    # move the sum at twice the rate and be clipped as two tensors, so the second stays at zero.
    lstm.bias_hh_l0.requires_grad_(False)
    nn.init.xavier_uniform_(model.fc.weight)
    nn.init.zeros_(model.fc.bias)
