"""The network kept, as ONNX (`logger.log_onnx`): the file MATLAB's importNetworkFromONNX (R2023b
and later) and any ONNX runtime load. Exported by PyTorch's TorchScript-based exporter from the
network as saved (evaluation mode, on the CPU): input `x` (samples, steps, features) with a
dynamic samples axis, output `y` (samples, responses). onnxruntime then predicts the run's own
training inputs with it, against the PyTorch network's predictions: a file that predicts
otherwise (by more than TOLERANCE) is not logged (tracking.model_logging.log_onnx logs it). The
next network of the same class and shapes in the process (a pack's members) takes the first one's
graph with its own weights instead of being traced again (_GRAPHS), and is checked the same way.

torch.onnx, onnx and onnxruntime are imported inside `export`: only a run that exports pays for
them (onnx alone takes about 0.7 s to import here)."""

from __future__ import annotations

import copy
import io
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

# Opset 17: Conv, LSTM and Gemm as onnxruntime and MATLAB's importer read them; the exporter folds
# the evaluation-mode BatchNorm into the convolution, so the file has no BatchNormalization.
OPSET = 17
TOLERANCE = 1e-5  # the most an ONNX prediction may differ from the PyTorch network's
N_CHECK = (
    64  # training samples predicted both ways before the file is logged (a 1440-step check: 0.2 s)
)


@dataclass
class Exported:
    """The network as an ONNX model, and how it compares with the network."""

    model: Any  # onnx.ModelProto
    operators: list[str]  # the ONNX operators its graph uses
    max_difference: (
        float  # onnxruntime's predictions against the PyTorch network's, on the check inputs
    )
    size_bytes: int
    example_output: (
        np.ndarray
    )  # the network's output for the first two check inputs (the model's signature)


def export(network: Any, inputs: np.ndarray) -> Exported:
    """`network` (an nn.Module taking (samples, steps, features)) as ONNX, predicted with
    onnxruntime on the first N_CHECK samples of `inputs` against the network itself."""
    import onnx  # onnx and onnxruntime: a run that exports only (see the module's docstring)
    import onnxruntime  # as onnx

    cpu = copy.deepcopy(network).to("cpu").eval()
    x = torch.from_numpy(np.ascontiguousarray(inputs[:N_CHECK], dtype=np.float32))
    shape = _shape(cpu, x)
    graph = _GRAPHS.get(shape)
    if graph is not None:
        model = _with_weights(graph, _weights(graph, cpu))
        data = model.SerializeToString()
    else:
        data = _traced(cpu, x)
        model = onnx.load_from_string(data)
        if _weights_match(model, cpu):
            _GRAPHS[shape] = model
    onnx.checker.check_model(model)
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    (predicted,) = session.run(None, {"x": x.numpy()})
    with torch.no_grad():
        expected = cpu(x).numpy()
    difference = float(np.abs(predicted - expected).max()) if len(expected) else 0.0
    return Exported(
        model,
        sorted({node.op_type for node in model.graph.node}),
        difference,
        len(data),
        expected[:2],
    )


def _traced(cpu: Any, x: torch.Tensor) -> bytes:
    """PyTorch's export of the network (about 90 ms of a run's end on the 2-core VM)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # It warns that an LSTM's batch size is traced as a constant: the dynamic axis frees it.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            cpu,
            (x[:2],),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "samples"}, "y": {0: "samples"}},
        )
    return buffer.getvalue()


# A pack's members and a study's jobs export networks of one class and shape again and again: the
# exporter traces each anew, though only the weights differ. So the first export's graph is kept,
# by the network's class, its parameters' shapes and the input's steps and features, and the next
# network of that shape gets a copy of it with its own weights, computed as the exporter computes
# them (_weights). Kept only where those weights equal the exporter's own for the network it
# exported (_weights_match); every file is then checked as any export is (onnxruntime against the
# network, at most TOLERANCE apart) before it is logged.
_GRAPHS: dict[tuple, Any] = {}


def _shape(cpu: Any, x: torch.Tensor) -> tuple:
    state = tuple((k, tuple(v.shape)) for k, v in cpu.state_dict().items())
    return (type(cpu), state, tuple(x.shape[1:]))


def _roles(graph: Any) -> Optional[dict[str, str]]:
    """Which initializer of an export of the CNN-LSTM is which weight (its Conv's, with the
    evaluation-mode BatchNorm folded in; its LSTM's W, R and B; its Gemm's), None where the graph is
    not that one: one Conv, one LSTM, one Gemm and no other initializer."""
    by_op: dict[str, list[Any]] = {}
    for node in graph.node:
        by_op.setdefault(node.op_type, []).append(node)
    if any(len(by_op.get(op, [])) != 1 for op in ("Conv", "LSTM", "Gemm")):
        return None
    (conv,), (lstm,), (gemm,) = by_op["Conv"], by_op["LSTM"], by_op["Gemm"]
    gemm_attrs = {a.name: a for a in gemm.attribute}
    if (
        len(conv.input) != 3
        or len(lstm.input) < 4
        or len(gemm.input) != 3
        or gemm_attrs.get("transB") is None
        or gemm_attrs["transB"].i != 1
        or ("transA" in gemm_attrs and gemm_attrs["transA"].i != 0)
        or any(gemm_attrs[name].f != 1.0 for name in ("alpha", "beta") if name in gemm_attrs)
    ):
        return None
    roles = {
        conv.input[1]: "conv_w",
        conv.input[2]: "conv_b",
        lstm.input[1]: "lstm_w",
        lstm.input[2]: "lstm_r",
        lstm.input[3]: "lstm_b",
        gemm.input[1]: "fc_w",
        gemm.input[2]: "fc_b",
    }
    if len(roles) != 7 or {i.name for i in graph.initializer} != set(roles):
        return None
    return roles


def _weights(model: Any, cpu: Any) -> Optional[dict[str, np.ndarray]]:
    """Each initializer of `model` computed from `cpu`'s parameters: the convolution with its
    BatchNorm's running statistics folded in, the LSTM's gates in ONNX's order (i, o, f, c from
    PyTorch's i, f, g, o) and its two biases as one, the Linear as it is. None where `model` or
    the network is not the CNN-LSTM these describe."""
    roles = _roles(model.graph)
    conv, bn = getattr(cpu, "conv", None), getattr(cpu, "bn", None)
    lstm, fc = getattr(cpu, "lstm", None), getattr(cpu, "fc", None)
    if (
        roles is None
        or not isinstance(conv, torch.nn.Conv1d)
        or not isinstance(bn, torch.nn.BatchNorm1d)
        or not isinstance(lstm, torch.nn.LSTM)
        or not isinstance(fc, torch.nn.Linear)
        or conv.bias is None
        or not bn.affine
        or bn.running_var is None
        or lstm.num_layers != 1
        or lstm.bidirectional
        or not lstm.bias
        or lstm.proj_size
        or fc.bias is None
    ):
        return None
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        h = lstm.hidden_size
        gates = torch.cat([torch.arange(0, h), torch.arange(3 * h, 4 * h), torch.arange(h, 3 * h)])
        values = {
            "conv_w": conv.weight * scale[:, None, None],
            "conv_b": (conv.bias - bn.running_mean) * scale + bn.bias,
            "lstm_w": lstm.weight_ih_l0[gates][None],
            "lstm_r": lstm.weight_hh_l0[gates][None],
            "lstm_b": torch.cat([lstm.bias_ih_l0[gates], lstm.bias_hh_l0[gates]])[None],
            "fc_w": fc.weight,
            "fc_b": fc.bias,
        }
        return {name: values[role].float().numpy() for name, role in roles.items()}


def _weights_match(model: Any, cpu: Any) -> bool:
    """Whether `_weights` gives `model`'s initializers (an export of `cpu`): the same shapes, and
    values within float32's rounding of the exporter's own folding."""
    from onnx import numpy_helper  # as onnx in export

    weights = _weights(model, cpu)
    if weights is None:
        return False
    for init in model.graph.initializer:
        exported = numpy_helper.to_array(init)
        ours = weights[init.name]
        if ours.shape != exported.shape or not np.allclose(ours, exported, rtol=1e-5, atol=1e-7):
            return False
    return True


def _with_weights(model: Any, weights: dict[str, np.ndarray]) -> Any:
    """A copy of `model` whose initializers are `weights` (by name)."""
    from onnx import ModelProto, numpy_helper  # as onnx in export

    out = ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    return out
