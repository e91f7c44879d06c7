"""torch → ONNX: eval mode, dynamic batch, every exchanged weight a true graph input.

The scoring contract (what ONNX Runtime's Java ``OrtSession.run`` accepts on a phone, and
what the Python device feeds too): the graph's inputs are the image ``input`` followed by
every exchanged tensor (the manifest's base and head names, in state-dict order), none of
which has an initializer; other constants stay initializers and are not inputs. Java's
``run`` refuses any name that is not a required input, and overridable initializers are not
required inputs, so weights kept as initializers could not be fed there.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import onnx
import torch
from torch import nn

from fedper.export.executorch_lowering import without_batch_counters

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
ONNX_OPSET = 18


class OnnxContractError(ValueError):
    """An ONNX model whose inputs do not follow the scoring contract."""


def export_onnx(model: nn.Module, input_size: int, weight_names: Sequence[str], opset: int = ONNX_OPSET) -> bytes:
    """ONNX bytes whose graph inputs are ``input`` and then ``weight_names``, no initializers.

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
            keep_initializers_as_inputs=True,  # False would merge equal tensors (all zero means)
            dynamo=False,
        )
    return weights_as_graph_inputs(onnx.load_from_string(buf.getvalue()), weight_names).SerializeToString()


def weights_as_graph_inputs(model: onnx.ModelProto, weight_names: Sequence[str]) -> onnx.ModelProto:
    """Turn the initializers named ``weight_names`` into graph inputs (and drop them as
    initializers); the inputs become ``input`` followed by ``weight_names`` in that order.

    Every weight name must be an initializer or already an input of the right type; any other
    graph input is an error, and any other initializer stays a constant (not an input).
    """
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    existing_inputs = {i.name: i for i in graph.input}
    if INPUT_NAME not in existing_inputs:
        raise OnnxContractError(f"the ONNX graph has no image input named {INPUT_NAME!r}")
    names = list(weight_names)
    if len(set(names)) != len(names):
        raise OnnxContractError("a weight name is given twice")
    new_inputs = [existing_inputs[INPUT_NAME]]
    for name in names:
        if name in initializers:
            t = initializers[name]
            new_inputs.append(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
        elif name in existing_inputs:
            new_inputs.append(existing_inputs[name])
        else:
            raise OnnxContractError(f"the ONNX graph has no weight {name!r} (neither initializer nor input)")
    extra = [n for n in existing_inputs if n != INPUT_NAME and n not in initializers and n not in set(names)]
    if extra:
        raise OnnxContractError(f"the ONNX graph takes inputs that are not weights: {extra[:3]}")
    keep = [t for t in graph.initializer if t.name not in set(names)]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    del graph.input[:]
    graph.input.extend(new_inputs)
    onnx.checker.check_model(model)
    return model
