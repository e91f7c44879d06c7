"""The device-side API over an export: train with the ExecuTorch training program.

:class:`TrainingProgram` loads ``train.pte``/``train.ptd`` with the ExecuTorch
runtime (what a phone runs), keeps the BatchNorm running statistics that the
program takes as inputs and returns as outputs, and applies SGD with momentum
with ExecuTorch's own optimizer. It implements :class:`fedper.trainer.Trainer`,
so the same local-training loop drives it and the eager reference. Nothing is
re-exported per round: new weights are copied into the runtime's tensors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedper.common import weights
from fedper.common.errors import FedperError
from fedper.common.manifest import Manifest, read_manifest
from fedper.device_runtime.inference_runtime import ExecuTorchInference, OnnxInference
from fedper.device_runtime.runtime_config import Evaluator


class TrainingProgramError(FedperError, RuntimeError):
    """The program does not match its manifest (e.g. wrong training metadata)."""


class TrainingProgram:
    """SGD on the exported ExecuTorch training program, with the device's own weights."""

    def __init__(
        self,
        directory: Path,
        manifest: Manifest | None = None,
        trainable: Literal["all", "head"] | None = None,
        evaluator: Evaluator = "executorch",
    ):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch
        from executorch.extension.training import TrainingModule

        self.directory = Path(directory)
        self.manifest = manifest or read_manifest(self.directory)
        art = self.manifest.artifacts
        spec = self.manifest.training_program
        self._method = spec.method
        self._stat_names = list(spec.bn_statistics)
        self._shapes = {t.name: tuple(t.shape) for t in self.manifest.tensors.base + self.manifest.tensors.head}
        module = _load_for_executorch(
            str(self.directory / art["training_program"]),
            data_path=str(self.directory / art["training_weights"]),
        )
        self._module = TrainingModule(module)
        self._stats: dict[str, torch.Tensor] = {
            n: torch.ones(self._shapes[n]) if n.endswith("running_var") else torch.zeros(self._shapes[n])
            for n in self._stat_names
        }
        # The runtime hands out its parameter tensors only after a first forward_backward.
        size = self.manifest.model.input_size
        self._module.forward_backward(
            self._method,
            (
                torch.zeros(2, 3, size, size),
                torch.zeros(2, dtype=torch.long),
                *self._stats.values(),
            ),
        )
        self._params: dict[str, torch.Tensor] = dict(self._module.named_parameters())
        check_training_metadata(self._module, self.manifest, self._params)
        mode = trainable or self.manifest.training.trainable
        if mode == "head" and not self.manifest.head_names:
            raise TrainingProgramError("training only the head needs a non-empty head (kp >= 1)")
        trainable_names = set(self.manifest.head_names) if mode == "head" else set(self._shapes)
        self._trainable_params = [n for n in self._params if n in trainable_names]
        self._trainable_stats = {n for n in self._stat_names if n in trainable_names}
        self._optimizer: Any = None
        self._evaluator_kind = evaluator
        self._evaluator: ExecuTorchInference | OnnxInference | None = None
        self._evaluator_stale = True
        self.set_tensors(self._initial_weights())

    def _initial_weights(self) -> dict[str, np.ndarray]:
        art = self.manifest.artifacts
        files = [self.directory / art["initial_base"], self.directory / art["initial_head"]]
        layout = self.manifest.layout("base") + self.manifest.layout("head")
        return weights.load_checked(files, layout)

    # --- the Trainer protocol -------------------------------------------------------------

    def set_tensors(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        with torch.no_grad():
            for name, value in tensors.items():
                src = torch.as_tensor(value, dtype=torch.float32)
                expected = self._shapes.get(name)
                if expected is None:
                    raise KeyError(f"the manifest has no tensor {name!r}")
                if tuple(src.shape) != expected:
                    raise ValueError(f"tensor {name!r}: shape {list(src.shape)}, expected {list(expected)}")
                if name in self._params:
                    self._params[name].copy_(src)
                else:
                    self._stats[name] = src.clone()
        self._evaluator_stale = True

    def get_tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        out = {}
        for name in names:
            if name in self._params:
                out[name] = self._params[name].detach().clone()
            elif name in self._stats:
                out[name] = self._stats[name].clone()
            else:
                raise KeyError(f"the manifest has no tensor {name!r}")
        return out

    def start_round(self, learning_rate: float, momentum: float) -> None:
        from executorch.extension.training import get_sgd_optimizer

        params = {n: self._params[n] for n in self._trainable_params}
        self._optimizer = get_sgd_optimizer(params, learning_rate, momentum, 0.0, 0.0, False)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        if self._optimizer is None:
            raise RuntimeError("call start_round() before train_step()")
        spec = self.manifest.training_program
        if not spec.min_batch <= len(x) <= spec.max_batch:
            raise ValueError(f"batch of {len(x)}; the program takes {spec.min_batch}..{spec.max_batch}")
        stats = [self._stats[n] for n in self._stat_names]
        outputs = self._module.forward_backward(self._method, (x.contiguous(), y.long(), *stats))
        for name, new in zip(self._stat_names, outputs[1:], strict=True):
            if name in self._trainable_stats:
                self._stats[name] = new
        grads = self._module.named_gradients()
        self._optimizer.step({n: grads[n] for n in self._trainable_params})
        self._evaluator_stale = True
        return float(outputs[0].item())

    def last_gradients(self) -> dict[str, torch.Tensor]:
        """The gradients of the last step (or check), copied: what another runtime's are compared with."""
        return {n: g.detach().clone() for n, g in self._module.named_gradients().items()}

    def check_batch(self, batch: int) -> None:
        """One forward and backward of zeros at ``batch`` (nothing changes): the program runs at
        that size and gives a finite loss and a gradient of every parameter's shape."""
        size = self.manifest.model.input_size
        stats = [self._stats[n] for n in self._stat_names]
        x, y = torch.zeros(batch, 3, size, size), torch.zeros(batch, dtype=torch.long)
        try:
            outputs = self._module.forward_backward(self._method, (x, y, *stats))
        except RuntimeError as e:
            raise TrainingProgramError(f"the training program does not run at batch {batch}: {e}") from e
        if not torch.isfinite(outputs[0]).all():
            raise TrainingProgramError(f"the training program's loss at batch {batch} is {float(outputs[0])}")
        for name, grad in self._module.named_gradients().items():
            if tuple(grad.shape) != self._shapes[name]:
                raise TrainingProgramError(f"at batch {batch}, the gradient of {name!r} has shape {list(grad.shape)}")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        evaluator = self._current_evaluator()
        return evaluator.predict(x)

    # --- FedPer conveniences ----------------------------------------------------------------

    def set_base(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        _check_exact(tensors, self.manifest.base_names, "base")
        self.set_tensors(tensors)

    def set_head(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        _check_exact(tensors, self.manifest.head_names, "head")
        self.set_tensors(tensors)

    def get_base(self) -> dict[str, torch.Tensor]:
        return self.get_tensors(self.manifest.base_names)

    def get_head(self) -> dict[str, torch.Tensor]:
        return self.get_tensors(self.manifest.head_names)

    def get_bn_statistics(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self._stats.items()}

    def _current_evaluator(self) -> ExecuTorchInference | OnnxInference:
        if self._evaluator is None:
            art = self.manifest.artifacts
            if self._evaluator_kind == "onnx":
                # As many threads as torch may use (one in a fleet worker).
                self._evaluator = OnnxInference(self.directory / art["onnx_model"], threads=torch.get_num_threads())
            else:
                self._evaluator = ExecuTorchInference(
                    self.directory / art["inference_program"],
                    self.manifest.inference_program.weights,
                )
        if self._evaluator_stale:
            self._evaluator.set_weights(self.get_tensors(self._shapes))
            self._evaluator_stale = False
        return self._evaluator


def median_step_ms(directory: Path, batch: int = 32, steps: int = 5) -> float:
    """Median wall time of one training step (forward, backward, SGD) of the exported program on
    random data, after one warm-up step: what a round costs a device of this machine's speed."""
    program = TrainingProgram(directory)
    size = program.manifest.model.input_size
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, program.manifest.output.num_classes, (batch,))
    program.start_round(0.01, 0.9)
    program.train_step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        program.train_step(x, y)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def check_exported(directory: Path, manifest: Manifest) -> None:
    """What ``fedper export`` runs before publishing: the program loads in the runtime a device
    uses, its training metadata is right (:func:`check_training_metadata`), and ``model.onnx``
    scores under the contract a phone's ONNX Runtime imposes (weights as graph inputs, exactly
    the manifest's base and head tensors)."""
    program = TrainingProgram(directory, manifest, evaluator="onnx")
    size = manifest.model.input_size
    program.predict(torch.zeros(1, 3, size, size))
    spec = manifest.training_program
    for batch in (spec.max_batch, spec.min_batch):  # a size fixed at the traced batch fails here
        program.check_batch(batch)


def check_training_metadata(module: Any, manifest: Manifest, params: Mapping[str, torch.Tensor]) -> None:
    """Fail loudly if the program's gradient/parameter bookkeeping is off.

    ExecuTorch 1.5.1 miscounts these indices for programs with mutated buffers and then
    silently returns the wrong tensors; our programs have no buffers, and this check keeps
    it that way.
    """
    spec = manifest.training_program
    shapes = {t.name: tuple(t.shape) for t in manifest.tensors.base + manifest.tensors.head}
    if list(params) != spec.parameters:
        raise TrainingProgramError(
            f"program parameters {list(params)[:3]}... differ from the manifest's {spec.parameters[:3]}..."
        )
    raw = module.model
    grad_index = raw.run_method("__et_training_gradients_index_" + spec.method, ())[0]
    param_index = raw.run_method("__et_training_parameters_index_" + spec.method, ())[0]
    if grad_index != len(spec.outputs) or param_index != grad_index + len(spec.parameters):
        raise TrainingProgramError(
            f"training metadata points at outputs {grad_index}/{param_index}; expected "
            f"{len(spec.outputs)}/{len(spec.outputs) + len(spec.parameters)} "
            "(the ExecuTorch index bug: re-export with fedper export)"
        )
    for name, tensor in list(params.items()) + list(module.named_gradients().items()):
        if tuple(tensor.shape) != shapes[name]:
            raise TrainingProgramError(f"program tensor {name!r} has shape {list(tensor.shape)}")


def _check_exact(tensors: Mapping[str, object], names: list[str], part: str) -> None:
    if set(tensors) != set(names):
        missing = sorted(set(names) - set(tensors))
        extra = sorted(set(tensors) - set(names))
        raise KeyError(f"{part} tensors differ from the manifest: missing {missing[:3]}, extra {extra[:3]}")
