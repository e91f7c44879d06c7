"""torch → ONNX: eval mode, dynamic batch, weights as named and overridable initializers."""

from __future__ import annotations

import io
import warnings

import torch
from torch import nn

from export.executorch_lowering import without_batch_counters

INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def export_onnx(model: nn.Module, input_size: int, opset: int = 18) -> bytes:
    """ONNX bytes whose initializers carry the model's state names and are also graph inputs.

    The TorchScript exporter is used with constant folding off: the dynamo exporter folds
    BatchNorm into the convolutions, which loses the names a device needs to set weights.
    """
    model = without_batch_counters(model).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, input_size, input_size),),
            buf,  # type: ignore[arg-type]  # the TorchScript exporter takes a file object
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=opset,
            do_constant_folding=False,
            keep_initializers_as_inputs=True,
            dynamo=False,
        )
    return buf.getvalue()
