"""The network kept, also as ONNX (logger.log_onnx, tracking/onnx_model.py): logged beside the
PyTorch model as `model-onnx`, predicting what the network predicts (onnxruntime, max abs
difference <= 1e-5), for the seed's one-step shape and for long sequences, and taken by predict.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqlab.model import CNNLSTM
from seqlab.tracking.onnx_model import TOLERANCE, export


@pytest.mark.parametrize(
    "steps, features, outputs", [(1, 4, 1), (1440, 3, 2)], ids=["seed-shape", "1440-steps"]
)
def test_the_export_predicts_as_the_network_with_any_number_of_samples(steps, features, outputs):
    torch.manual_seed(0)
    network = CNNLSTM(features, outputs, hidden_size=16)
    network.train()  # trained networks are exported as saved: in evaluation mode, BatchNorm's statistics
    network(torch.randn(32, steps, features))  # running statistics that are not the initial ones
    inputs = np.random.default_rng(0).standard_normal((40, steps, features)).astype(np.float32)
    exported = export(network, inputs)
    assert exported.max_difference <= TOLERANCE
    assert exported.example_output.shape == (2, outputs)
    assert {"Conv", "LSTM", "Gemm"} <= set(
        exported.operators
    ) and "BatchNormalization" not in exported.operators
    assert network.training, "the network itself is left as it was (the export is of a copy)"


def test_padded_sequences_with_the_onnx_model_are_one_line_naming_the_pytorch_model():
    from types import SimpleNamespace

    from seqlab import SeqlabError
    from seqlab.predict import _predict

    onnx_model = SimpleNamespace(
        metadata=SimpleNamespace(flavors={"onnx": {}, "python_function": {}})
    )
    x = np.zeros((3, 4, 2), np.float32)
    with pytest.raises(
        SeqlabError,
        match=r"^data: sequences of different lengths: the ONNX model takes sequences of "
        r"one length; predict them with the run's PyTorch model \(run=<run id>\)$",
    ):
        _predict(onnx_model, x, np.array([4, 2, 3]))
