"""An exported model's programs against eager PyTorch: one training step (loss, BatchNorm
statistics, every gradient) and the inference program's logits, through the ExecuTorch runtime
as a device runs them. Shared by the export tests of a user's model and of every named model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from fedper.common import weights
from fedper.common.manifest import read_manifest
from fedper.data import DataConfig, load_dataset, to_tensor
from fedper.models import ModelConfig, build_model
from tests.support.numeric_claims import NumericClaims

Yardstick = Literal["float64", "kinks"]
# One ReLU input within float32 rounding of zero that goes the other way moves its layer's
# gradients by up to 1.8% in L2 (torchvision's ResNet-18 at 64 px, digits, under the default,
# AVX2 and AVX-512 kernel sets; 17% of the tensor's largest element): the "kinks" bound.
KINK_L2 = 0.05


def digits(batch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``batch`` digits at ``size`` px, normalized as the digits export declares."""
    ds = load_dataset(DataConfig(dataset="digits", image_size=size))
    return to_tensor(ds.images[:batch], ds.mean, ds.std), torch.from_numpy(ds.labels[:batch])


def off(a: torch.Tensor, b: torch.Tensor, every: dict[str, torch.Tensor]) -> float:
    """max |a - b| relative to b's largest element, floored at a thousandth of the model's largest gradient."""
    scale = max(float(g.abs().max()) for g in every.values())
    return float((a.double() - b.double()).abs().max() / max(float(b.abs().max()), 1e-3 * scale))


def off_l2(a: torch.Tensor, b: torch.Tensor, every: dict[str, torch.Tensor]) -> float:
    """||a - b|| relative to ||b||, floored at a thousandth of the model's largest gradient norm."""
    scale = max(float(g.norm()) for g in every.values())
    return float((a.double() - b.double()).norm() / max(float(b.norm()), 1e-3 * scale))


def step_matches_eager(
    artifacts: Path,
    batch: int,
    max_batch: int,
    claim: NumericClaims,
    yardstick: Yardstick = "float64",
    gradients: bool = True,
) -> None:
    """One step of the program at ``batch`` (right after one at the other end of its range, so the
    runtime resizes) on digits: its loss within 1e-5 of eager's, its running statistics eager's,
    and its gradients against eager's in float64.

    ``float64``: each gradient within 3x eager float32's own error plus 1e-3, relative to the
    tensor's largest gradient (or a thousandth of the model's largest where a tensor's gradient
    is zero in exact arithmetic, e.g. a BatchNorm shift that a following BatchNorm cancels).

    ``kinks``, for deep ReLU networks: some ReLU inputs sit within float32 rounding of zero (a
    channel BatchNorm normalizes from a near-constant map amplifies rounding 300-fold), and any
    float32 computation that sums in another order (another kernel set, ExecuTorch's) routes
    their gradients the other way, which moves single elements by up to 17% of a tensor's largest
    while a millionth of input noise moves nothing. The loss is then held to float64's within 3x
    eager float32's own error (plus 1e-5), and each gradient to float64's in relative L2 within
    ``KINK_L2`` or 3x the largest distance of any of eager float32's gradients from float64's,
    whichever is larger (eager's distance on one tensor is a matter of chance: MobileNetV2 at 224
    px and batch 2 has eager 2-4% off on most tensors and 0.4% on the first BatchNorm's weight,
    where the program is 7.6% off): a wrong formula is off by O(1) where float32 is well
    conditioned (at larger batches: MobileNetV2 at batch 8, 1.6e-6).

    ``gradients=False``: the loss and statistics only, for a step float32 cannot compute
    gradients of (tests/integration/test_model_zoo.py: a late BatchNorm of 1x1 maps at a batch of
    2 or 4, where eager float32's own forward is 5e-3 off float64 at the last BatchNorm and one
    ReLU6 flipped there moves every gradient below it by 10%)."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    manifest = read_manifest(artifacts)
    spec, size = manifest.training_program, manifest.model.input_size
    x, y = digits(max_batch, size)
    module = TrainingModule(_load_for_executorch(str(artifacts / manifest.artifacts["training_program"]),
                                                 data_path=str(artifacts / manifest.artifacts["training_weights"])))  # fmt: skip
    shapes = {t.name: t.shape for t in manifest.tensors.base + manifest.tensors.head}
    stats = [torch.ones(shapes[n]) if n.endswith("running_var") else torch.zeros(shapes[n]) for n in spec.bn_statistics]
    other = 2 if batch == max_batch else max_batch
    module.forward_backward(spec.method, (x[:other], y[:other], *stats))
    x, y = x[:batch], y[:batch]
    loss, *new_stats = module.forward_backward(spec.method, (x, y, *stats))
    params = module.named_parameters()
    program_gradients = {n: t.clone() for n, t in module.named_gradients().items()}
    model = build_model(ModelConfig(**manifest.model.model_dump())).train()
    model.load_state_dict({n: p.detach().clone() for n, p in params.items()}, strict=False)
    model64 = copy.deepcopy(model).double()  # before the forward updates the running statistics
    eager_loss = nn.functional.cross_entropy(model(x), y)
    eager_loss.backward()
    eager = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    if yardstick == "float64":
        claim.below(f"batch {batch}: relative |program - eager| loss", abs(float(loss) / float(eager_loss) - 1), 1e-5)
    state = model.state_dict()
    assert len(new_stats) == len(spec.bn_statistics)
    if spec.bn_statistics and yardstick == "float64":
        claim.close(f"batch {batch}: BatchNorm statistics, program against eager",
                    torch.cat([t.detach().flatten() for t in new_stats]),
                    torch.cat([state[n].flatten() for n in spec.bn_statistics]), rtol=1e-3, atol=1e-4)  # fmt: skip
    loss64 = nn.functional.cross_entropy(model64(x.double()), y)
    loss64.backward()
    if spec.bn_statistics and yardstick == "kinks":
        # Two values per channel in a late 1x1 map: their variance cancels in float32 (program and
        # eager alike), so the statistics are held to float64's within 3x eager's own distance.
        state64 = model64.state_dict()
        exact = torch.cat([state64[n].flatten() for n in spec.bn_statistics])

        def distance(stats: list[torch.Tensor]) -> float:
            return float((torch.cat([t.detach().flatten().double() for t in stats]) - exact).norm() / exact.norm())

        eager_distance = distance([state[n] for n in spec.bn_statistics])
        claim.below(f"batch {batch}: BatchNorm statistics' relative L2 distance from float64 beyond 3x eager's",
                    distance(new_stats) - 3 * eager_distance, 1e-5, f"(eager float32's: {eager_distance:.2g})")  # fmt: skip
    if yardstick == "kinks":
        # At a batch of 2 a late BatchNorm of 1x1 maps normalizes two values, and float32's own
        # loss is off float64's by percents (torchvision's MobileNetV2 at 32 px: 4%, ResNet-34: 15%).
        eager_error = abs(float(eager_loss) / float(loss64) - 1)
        claim.below(f"batch {batch}: relative |program - float64| loss beyond 3x eager float32's",
                    abs(float(loss) / float(loss64) - 1) - 3 * eager_error, 1e-5,
                    f"(eager float32's: {eager_error:.2g})")  # fmt: skip
    reference = {n: p.grad for n, p in model64.named_parameters() if p.grad is not None}
    assert set(eager) == set(program_gradients) == set(spec.parameters) == set(reference)
    if not gradients:
        return
    if yardstick == "float64":
        errors = {
            n: (off(program_gradients[n], reference[n], reference), off(eager[n], reference[n], reference))
            for n in eager
        }
        worst = max(errors, key=lambda n: errors[n][0] - 3 * errors[n][1])
        claim.below(f"batch {batch}: largest gradient error beyond 3x eager's (float64)",
                    errors[worst][0] - 3 * errors[worst][1], 1e-3,
                    f"({worst}: program {errors[worst][0]:.2g}, eager {errors[worst][1]:.2g})")  # fmt: skip
        return
    l2 = {
        n: (off_l2(program_gradients[n], reference[n], reference), off_l2(eager[n], reference[n], reference))
        for n in eager
    }
    # Eager float32's distance varies from tensor to tensor by chance (which kinks its rounding
    # flips, how much a reduction cancels): its largest over the model is float32's scale here.
    eager_scale = max(e for _, e in l2.values())
    allowance = max(KINK_L2, 3 * eager_scale)
    worst = max(l2, key=lambda n: l2[n][0])
    claim.below(f"batch {batch}: largest relative L2 gradient error against float64 beyond max({KINK_L2}, 3x eager's)",
                l2[worst][0] - allowance, 0.0,
                f"({worst}: program {l2[worst][0]:.2g}, eager float32 {l2[worst][1]:.2g}, "
                f"at most {eager_scale:.2g} on any tensor)")  # fmt: skip


def inference_matches_eager(artifacts: Path, claim: NumericClaims, images: int = 4) -> None:
    """The inference program's logits (through the ExecuTorch runtime, as a device scores) on
    digits against eager PyTorch's in eval mode with the exported initial weights."""
    from fedper.device_runtime.training_program import TrainingProgram

    manifest = read_manifest(artifacts)
    x, _ = digits(images, manifest.model.input_size)
    model = build_model(ModelConfig(**manifest.model.model_dump())).eval()
    tensors = weights.load_checked([artifacts / "base.safetensors", artifacts / "head.safetensors"],
                                   manifest.layout("base") + manifest.layout("head"))  # fmt: skip
    model.load_state_dict({n: torch.as_tensor(v) for n, v in tensors.items()}, strict=False)
    program = TrainingProgram(artifacts)
    with torch.no_grad():
        eager = model(x)
    claim.close("inference program against eager, logits", program.predict(x), eager, rtol=1e-4, atol=1e-5)
