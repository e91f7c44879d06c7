"""torch → ExecuTorch: the training program (joint forward+backward) and the inference program.

Both keep their weights in a separate ``.ptd`` file, keyed by the model's state
names, so a device can change weights without a new program.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.export import Dim, export
from torch.export.experimental import _export_forward_backward

from export.training_graph import TrainingStep

GRADIENTS_INDEX = "__et_training_gradients_index_forward"
PARAMETERS_INDEX = "__et_training_parameters_index_forward"
FQN_METHOD = "__et_training_fqn_forward"


class ExportError(RuntimeError):
    """The export produced something that would not behave as the model does."""


@dataclass(frozen=True)
class LoweredProgram:
    program: bytes  # .pte
    weights: bytes  # .ptd


def _split_files(manager: object) -> LoweredProgram:
    tensor_data = getattr(manager, "_tensor_data", None) or {}
    if len(tensor_data) != 1:
        raise ExportError(f"expected one external weights file, got {sorted(tensor_data)}")
    (cord,) = tensor_data.values()
    return LoweredProgram(program=bytes(manager.buffer), weights=bytes(cord))  # type: ignore[attr-defined]


def lower_training_program(step: TrainingStep, input_size: int, max_batch: int) -> LoweredProgram:
    """Export ``step`` with a dynamic batch (2..max_batch) and its weights in a .ptd."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    example_batch = 2
    x = torch.zeros(example_batch, 3, input_size, input_size)
    y = torch.zeros(example_batch, dtype=torch.long)
    stats = [torch.zeros(_num_features(step, n)) for n in step.stat_names]
    batch = Dim("batch", min=2, max=max_batch)
    dynamic = ({0: batch}, {0: batch}, tuple(None for _ in stats))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)
        exported = export(step, (x, y, *stats), dynamic_shapes=dynamic, strict=False)
        joint = _export_forward_backward(exported, joint_loss_index=0)
        edge = to_edge(joint, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        manager = edge.to_executorch(
            ExecutorchBackendConfig(external_constants=True, external_mutable_weights=True)
        )
    return _split_files(manager)


def lower_inference_program(model: nn.Module, input_size: int) -> LoweredProgram:
    """Export the eval-mode model for one image; all weights and BN statistics go to the .ptd."""
    from executorch.exir import ExecutorchBackendConfig, to_edge

    model = without_batch_counters(model).eval()
    x = torch.zeros(1, 3, input_size, input_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = export(model, (x,), strict=False)
        manager = to_edge(exported).to_executorch(ExecutorchBackendConfig(external_constants=True))
    return _split_files(manager)


def _num_features(step: TrainingStep, stat_name: str) -> int:
    bn_path = stat_name.rsplit(".", 1)[0]
    weight = step.get_parameter(f"{bn_path}.weight")
    return int(weight.shape[0])


def without_batch_counters(model: nn.Module) -> nn.Module:
    """A copy without BN's integer ``num_batches_tracked`` (eval mode never reads it), so the
    weights file holds exactly the exchanged tensors."""
    import copy

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.num_batches_tracked = None
    return model
