"""Planned memory read from a real exported program, against the step's lower bound."""

from __future__ import annotations

import torch

from fedper.common.manifest import read_manifest
from fedper.export.executorch_lowering import example_inputs
from fedper.export.program_memory import planned_memory, step_lower_bound
from fedper.export.training_graph import training_step
from fedper.models import ModelConfig, build_model


class _Scaled(torch.nn.Module):
    """loss = sum(x * w): saves x (and w, a parameter); its one big temporary is x * w."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x * self.w).sum(),)


def test_the_lower_bound_counts_parameters_gradients_saved_tensors_and_the_largest_temporary():
    bound = step_lower_bound(_Scaled(100), (torch.randn(32, 100),))
    assert bound.parameters == bound.gradients == 100 * 4
    assert bound.saved == 32 * 100 * 4  # x; w is a parameter, counted once as such
    assert bound.largest_transient == 32 * 100 * 4
    assert bound.total == 2 * 400 + 2 * 12800


def test_the_exported_program_plans_at_most_twice_the_steps_lower_bound(artifacts):
    """The planned memory is at least the program's liveness peak (no planner goes below it), which
    holds at least the parameters and their gradients (both planned), and at most twice what eager
    PyTorch holds for the same step at the program's largest batch (issue 29's target; before
    one delegate per run of consecutive ops, 2.5 times)."""
    manifest = read_manifest(artifacts)
    memory = planned_memory((artifacts / manifest.artifacts["training_program"]).read_bytes())
    assert len(memory.buffers) == 1 and memory.liveness_peak <= memory.total
    model = build_model(ModelConfig(**manifest.model.model_dump()))
    step = training_step(model, manifest.training_program.variant)
    batch, size = manifest.training_program.max_batch, manifest.model.input_size
    bound = step_lower_bound(step, example_inputs(step, size, batch))
    assert bound.parameters + bound.gradients <= memory.liveness_peak
    assert memory.total <= 2 * bound.total, (memory.total, bound)
