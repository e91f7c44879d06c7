"""Scoring images with the exported inference models and a device's *current* weights.

Neither model has weights baked in: the ExecuTorch program loads a ``.ptd``
written from the given tensors, and the ONNX model takes its weights as true
graph inputs (no initializers), fed with the image on every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from fedper.common.errors import FedperError
from fedper.device_runtime.weights_file import encode_ptd


class OnnxContractError(FedperError, ValueError):
    """An ONNX model or a weight set that breaks the scoring contract (see docs/EXPORT.md)."""


class ExecuTorchInference:
    """The batch-1 inference program; ``set_weights`` rebuilds its weight file in memory."""

    def __init__(self, program: Path, weight_names: list[str]):
        self._program = Path(program).read_bytes()
        self._names = list(weight_names)
        self._module: object | None = None
        self._weights = b""

    def set_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        missing = [n for n in self._names if n not in tensors]
        if missing:
            raise KeyError(f"inference weights lack {len(missing)} tensor(s), e.g. {missing[:3]}")
        # The loaded program reads its weights from this buffer without copying it: the buffer
        # must live as long as the module (freed, a large model's scoring read freed memory and
        # crashed: torchvision's ResNet-34).
        weights = encode_ptd({n: tensors[n].float() for n in self._names})
        module = _load_for_executorch_from_buffer(self._program, data_map_buffer=weights)
        self._module, self._weights = module, weights

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self._module is None:
            raise RuntimeError("call set_weights() first")
        outs = [self._module.forward((x[i : i + 1].contiguous(),))[0] for i in range(len(x))]  # type: ignore[attr-defined]
        return torch.cat(outs)


class OnnxInference:
    """ONNX Runtime under the scoring contract a phone's ONNX Runtime (Java) imposes.

    Java's ``OrtSession.run`` takes exactly the model's required inputs: the image ``input``
    and every weight as a true graph input (no initializers to override). This class feeds
    exactly ``{i.name for i in session.get_inputs()}`` too, so a model or a weight set that
    would fail on a phone fails here, with the tensor named.
    """

    IMAGE_INPUT = "input"

    def __init__(self, model: Path, threads: int = 0):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        if self.IMAGE_INPUT not in inputs:
            raise OnnxContractError(
                f"{model}: no image input named {self.IMAGE_INPUT!r} (inputs {list(inputs)[:3]}...)"
            )
        overridable = [i.name for i in self._session.get_overridable_initializers()]
        if overridable:
            raise OnnxContractError(
                f"{model}: weights such as {overridable[0]!r} are initializers, which ONNX Runtime Java "
                "cannot feed; re-export with fedper export (weights as graph inputs)"
            )
        self._weight_shapes = {n: tuple(s) for n, s in inputs.items() if n != self.IMAGE_INPUT}
        self._weights: dict[str, np.ndarray] = {}

    @property
    def input_names(self) -> set[str]:
        """The model's required inputs: exactly what :meth:`feeds` returns."""
        return {self.IMAGE_INPUT, *self._weight_shapes}

    def set_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Every weight input, nothing else, each of its input's shape."""
        unknown = sorted(n for n in tensors if n not in self._weight_shapes)
        if unknown:
            raise OnnxContractError(f"the ONNX model has no weight input named {unknown[0]!r} ({len(unknown)} unknown)")
        missing = [n for n in self._weight_shapes if n not in tensors]
        if missing:
            raise OnnxContractError(
                f"no tensor given for the ONNX weight input {missing[0]!r} ({len(missing)} missing)"
            )
        weights = {n: tensors[n].detach().float().numpy() for n in self._weight_shapes}
        for name, value in weights.items():
            if value.shape != self._weight_shapes[name]:
                raise OnnxContractError(
                    f"ONNX weight input {name!r} has shape {list(self._weight_shapes[name])}, given {list(value.shape)}"
                )
        self._weights = weights

    def feeds(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        """What ``session.run`` gets for the image batch ``x``: one entry per model input."""
        if not self._weights:
            raise RuntimeError("call set_weights() first")
        return {self.IMAGE_INPUT: x.detach().float().contiguous().numpy(), **self._weights}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self._session.run(None, self.feeds(x))[0])
