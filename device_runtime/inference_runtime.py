"""Scoring images with the exported inference models and a device's *current* weights.

Neither model has weights baked in: the ExecuTorch program loads a ``.ptd``
written from the given tensors, and the ONNX model takes its weights as
overridable initializers (they are also graph inputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from device_runtime.weights_file import encode_ptd


class ExecuTorchInference:
    """The batch-1 inference program; ``set_weights`` rebuilds its weight file in memory."""

    def __init__(self, program: Path, weight_names: list[str]):
        self._program = Path(program).read_bytes()
        self._names = list(weight_names)
        self._module: object | None = None

    def set_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        missing = [n for n in self._names if n not in tensors]
        if missing:
            raise KeyError(f"inference weights lack {len(missing)} tensor(s), e.g. {missing[:3]}")
        ptd = encode_ptd({n: tensors[n].float() for n in self._names})
        self._module = _load_for_executorch_from_buffer(self._program, data_map_buffer=ptd)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self._module is None:
            raise RuntimeError("call set_weights() first")
        outs = [self._module.forward((x[i : i + 1].contiguous(),))[0] for i in range(len(x))]  # type: ignore[attr-defined]
        return torch.cat(outs)


class OnnxInference:
    """ONNX Runtime with the model's initializers overridden by the given tensors."""

    def __init__(self, model: Path, threads: int = 0):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # initializers-as-inputs is deliberate; skip the warning
        if threads:
            options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._overridable = {i.name for i in self._session.get_overridable_initializers()}
        self._feeds: dict[str, np.ndarray] = {}

    def set_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        unknown = [n for n in tensors if n not in self._overridable]
        if unknown:
            raise KeyError(f"the ONNX model has no initializer named {unknown[0]!r}")
        self._feeds = {n: t.detach().float().numpy() for n, t in tensors.items()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        feeds = {self._input: x.numpy(), **self._feeds}
        return torch.from_numpy(self._session.run(None, feeds)[0])
