"""The network kept, as ONNX (`logger.log_onnx`): the file MATLAB's importNetworkFromONNX (R2023b
and later) and any ONNX runtime load. Exported by PyTorch's TorchScript-based exporter from the
network as saved (evaluation mode, on the CPU): input `x` (samples, steps, features) with a
dynamic samples axis, output `y` (samples, responses). onnxruntime then predicts the run's own
training inputs with it, against the PyTorch network's predictions: a file that predicts
otherwise (by more than TOLERANCE) is not logged (tracking.model_logging.log_onnx logs it).

torch.onnx, onnx and onnxruntime are imported inside `export`: only a run that exports pays for
them (onnx alone takes about 0.7 s to import here)."""

from __future__ import annotations

import copy
import io
import warnings
from dataclasses import dataclass
from typing import Any

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
    data = buffer.getvalue()
    model = onnx.load_from_string(data)
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
