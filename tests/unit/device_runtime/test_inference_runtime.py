"""The device's ExecuTorch scoring with its own weights (``ExecuTorchInference``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import gc, sys, torch
from torch import nn
from fedper.device_runtime.inference_runtime import ExecuTorchInference
from fedper.export.executorch_lowering import lower_inference_program

torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 48_000), nn.ReLU(), nn.Linear(48_000, 10)).eval()
program = sys.argv[1] + "/infer.pte"
open(program, "wb").write(lower_inference_program(model, 8).program)
scorer = ExecuTorchInference(program, [n for n, _ in model.named_parameters()])
scorer.set_weights(dict(model.named_parameters()))
gc.collect()
noise = [bytes(40_000_000) for _ in range(2)]  # reuses what a freed weight buffer held
x = torch.randn(2, 3, 8, 8)
torch.testing.assert_close(scorer.predict(x), model(x).detach(), rtol=1e-4, atol=1e-5)
print("scored")
"""


@pytest.mark.export
def test_scoring_keeps_its_weight_buffer_alive_as_long_as_the_program(tmp_path: Path) -> None:
    """The runtime reads the weights from the buffer it was given, without copying: a buffer freed
    after loading (a local variable, before) crashed a large model's scoring (ResNet-34's 85 MB
    weights are unmapped when freed). 37 MB of weights here, beyond glibc's largest mmap threshold,
    in a child process, since the failure is a segmentation fault."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip().endswith("scored")
