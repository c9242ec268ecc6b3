"""The network kept, also as ONNX (logger.log_onnx, tracking/onnx_model.py): logged beside the
PyTorch model as `model-onnx`, predicting what the network predicts (onnxruntime, max abs
difference <= 1e-5), for the seed's one-step shape and for long sequences, and taken by predict.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqlab.model import CNNLSTM
from seqlab.tracking import onnx_model
from seqlab.tracking.onnx_model import TOLERANCE, export


def _trained(seed: int, steps: int, features: int, outputs: int) -> CNNLSTM:
    """A network whose BatchNorm statistics and weights are its own (seed)."""
    torch.manual_seed(seed)
    network = CNNLSTM(features, outputs, hidden_size=16)
    network.train()
    network(torch.randn(32, steps, features) * (1 + seed))
    return network


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


@pytest.mark.parametrize("steps, features", [(1, 4), (60, 3)], ids=["seed-shape", "60-steps"])
def test_the_next_network_of_a_shape_takes_the_kept_graph_with_its_own_weights(
    monkeypatch, steps, features
):
    monkeypatch.setattr(onnx_model, "_GRAPHS", {})
    inputs = np.random.default_rng(1).standard_normal((40, steps, features)).astype(np.float32)
    export(_trained(0, steps, features, 2), inputs)
    assert len(onnx_model._GRAPHS) == 1  # the exporter's weights are _weights' own: kept
    second = _trained(1, steps, features, 2)

    def traced(*_):
        raise AssertionError("traced again")

    with monkeypatch.context() as m:
        m.setattr(onnx_model, "_traced", traced)
        kept = export(second, inputs)
    assert kept.max_difference <= TOLERANCE
    onnx_model._GRAPHS.clear()
    traced_anew = export(second, inputs)  # PyTorch's exporter on this network itself
    assert kept.model.SerializeToString() == traced_anew.model.SerializeToString()
    assert kept.size_bytes == traced_anew.size_bytes and kept.operators == traced_anew.operators
    # Another shape of input, or of network, is traced for itself.
    other = np.random.default_rng(2).standard_normal((8, steps + 1, features)).astype(np.float32)
    assert export(second, other).max_difference <= TOLERANCE
    assert len(onnx_model._GRAPHS) == 2


def test_a_graph_whose_weights_are_not_the_cnn_lstms_is_not_kept(monkeypatch):
    monkeypatch.setattr(onnx_model, "_GRAPHS", {})
    network = _trained(0, 1, 4, 1)
    network.bn = (
        torch.nn.Identity()
    )  # no BatchNorm to fold: the weights' recipe is not this graph's
    inputs = np.random.default_rng(0).standard_normal((16, 1, 4)).astype(np.float32)
    assert export(network, inputs).max_difference <= TOLERANCE
    assert onnx_model._GRAPHS == {}


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
