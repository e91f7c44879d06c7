"""Start a model's base from a checkpoint (``--init PATH``) instead of random weights.

Every real deployment starts from a pretrained base. Accepted, as safetensors files:

- the toolkit's own tensor names (``fedper pretrain``'s base, or any base/weights file it wrote);
- a MobileNet-V1 state dict in timm's ``mobilenetv1_100`` layout (``conv_stem``, ``bn1``,
  ``blocks.<stage>.<i>.conv_dw/bn1/conv_pw/bn2``), whose 13 blocks map in order onto ours;
- torchvision's ``resnet34`` state dict (the same names as ``--model resnet34``).

Only the base comes from the checkpoint: the head (the top ``kp`` layer groups) stays fresh, and
so does the classifier even at kp=0, since a checkpoint's classifier answers another question
(ImageNet's 1000 classes). Every base tensor must be in the checkpoint with the model's shape;
otherwise a :class:`CheckpointError` names the file, the first mismatches and what was expected.

Pickled checkpoints (``.pth``, ``.pt``, ``.bin``) are refused, never unpickled: convert one once,
on a machine you trust, with the command the error message gives.

A model given by reference (``torchvision:NAME``, ``PACKAGE.MODULE:CALLABLE``) starts from a state
dict in its own layout (the ``model`` layout): a safetensors file, or a torch ``.pt``/``.pth`` file
read by ``torch.load(weights_only=True)``, which loads tensors and plain containers and runs no
code from the file. Every tensor but the classifier's must be there with the model's shape; the
classifier is taken too where its shapes match (a checkpoint for the same classes), else it starts
fresh (e.g. ImageNet's 1000 classes), and the reason is recorded. kp does not matter: the head's
other layers start from the checkpoint too (each device then personalizes them).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedper.common import weights
from fedper.common.errors import FedperError
from fedper.models.config import MODEL_NAMES
from fedper.models.mobilenet_v1 import BLOCKS
from fedper.models.split import exchanged_names, split
from fedper.models.staged import StagedModel, under
from fedper.pretrained import PACKAGED_BASE, PRETRAINED, SCRATCH

# timm's mobilenetv1_100 groups the 13 blocks into stages of these lengths (arch_def in
# timm/models/efficientnet.py: dsa_r1, dsa_r2, dsa_r2, dsa_r6, dsa_r2).
TIMM_STAGE_REPEATS = (1, 2, 2, 6, 2)
_TIMM_BLOCK = re.compile(r"blocks\.(\d+)\.(\d+)\.(conv_dw|bn1|conv_pw|bn2)\.(.+)")
_TIMM_PART = {"conv_dw": "dw.conv", "bn1": "dw.bn", "conv_pw": "pw.conv", "bn2": "pw.bn"}
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl")
TORCH_SUFFIXES = (".pt", ".pth")  # read with torch.load(weights_only=True) for a model given by reference
MODEL_LAYOUT = "model"  # a model given by reference: its own state-dict names
SHOWN_MISMATCHES = 5

assert sum(TIMM_STAGE_REPEATS) == len(BLOCKS)


class CheckpointError(FedperError, ValueError):
    """A checkpoint that cannot start this model's base."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read once: its tensors under this toolkit's names, and where they came from."""

    path: Path
    sha256: str
    layout: str  # "fedper", "timm-mobilenetv1", "torchvision-resnet34" or "model" (a model given by reference)
    model_name: str
    tensors: dict[str, np.ndarray]


@dataclass(frozen=True)
class InitSource:
    """Where a base came from: what reports and model cards say about it."""

    path: str
    sha256: str
    layout: str
    tensors: int  # base tensors taken from the checkpoint
    fresh: tuple[str, ...]  # exchanged tensors left at their initial values (head, classifier)
    notes: tuple[str, ...] = ()  # what a user should know (e.g. why the classifier starts fresh)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "sha256": self.sha256, "layout": self.layout,
                                  "tensors": self.tensors, "fresh": list(self.fresh)}  # fmt: skip
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def read_checkpoint(path: Path, model_name: str) -> Checkpoint:
    """Read a safetensors checkpoint for a ``model_name`` model; a pickle is refused with how to
    convert it."""
    path = Path(path)
    if model_name not in MODEL_NAMES:
        return _read_model_layout(path, model_name)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{path}: pickled checkpoints are not loaded (unpickling runs code from the file). Convert it "
            'once, on a machine you trust: python -c "import sys, torch; from safetensors.torch import '
            "save_file; sd = torch.load(sys.argv[1], map_location='cpu', weights_only=True); "
            "save_file({k: v.contiguous() for k, v in sd.get('state_dict', sd).items()}, sys.argv[2])\" "
            f"{path} {path.with_suffix('.safetensors')}"
        )
    try:
        data = path.read_bytes()
        raw = weights.decode(data, str(path))
    except (OSError, weights.WeightsError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors checkpoint: {exc}") from exc
    layout = layout_of(raw, model_name)
    return Checkpoint(path, hashlib.sha256(data).hexdigest(), layout, model_name, to_model_names(raw, layout))


def _read_model_layout(path: Path, model_name: str) -> Checkpoint:
    """A state dict in the layout of the model given by reference ``model_name``: safetensors, or a
    torch file read with ``weights_only=True`` (never a plain unpickling)."""
    if path.resolve() == PACKAGED_BASE.resolve():
        raise CheckpointError(
            f"--init {PRETRAINED} is the packaged MobileNet-V1 base (width 0.25, 32 px): it cannot start "
            f"{model_name}; give --init {SCRATCH} or a checkpoint in the model's own layout"
        )
    if path.suffix.lower() in PICKLE_SUFFIXES and path.suffix.lower() not in TORCH_SUFFIXES:
        raise CheckpointError(
            f"{path}: a {path.suffix} file is not read; give a safetensors file or a torch state dict saved as "
            f"{' or '.join(TORCH_SUFFIXES)} (read with torch.load(weights_only=True))"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {exc.strerror}") from exc
    if path.suffix.lower() in TORCH_SUFFIXES:
        raw = _torch_state_dict(path)
    else:
        try:
            raw = weights.decode(data, str(path))
        except weights.WeightsError as exc:
            raise CheckpointError(f"{path}: not a readable safetensors checkpoint: {exc}") from exc
    tensors = {k: v for k, v in raw.items() if np.issubdtype(v.dtype, np.floating)}  # BN's counters are not weights
    return Checkpoint(path, hashlib.sha256(data).hexdigest(), MODEL_LAYOUT, model_name, tensors)


def _torch_state_dict(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a torch ``.pt``/``.pth`` state dict (or of its ``state_dict`` entry), read with
    ``weights_only=True``: tensors and plain containers only, no code from the file."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError or others for a bad file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(
            f"{path}: not a torch state dict torch.load(weights_only=True) can read: {type(exc).__name__}: {first}"
        ) from exc
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not loaded:
        raise CheckpointError(f"{path}: expected a state dict (tensor names to tensors), got a {type(loaded).__name__}")
    bad = [k for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: expected a state dict of tensors; {bad[0]!r} is a "
                              f"{type(loaded[bad[0]]).__name__}")  # fmt: skip
    return {k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.numpy() for k, v in loaded.items()}


def layout_of(names: Mapping[str, object], model_name: str) -> str:
    """Which naming a checkpoint uses, told by names only one layout has."""
    if "conv_stem.weight" in names:
        return "timm-mobilenetv1"
    if model_name == "resnet34" and "layer1.0.conv1.weight" in names:
        return "torchvision-resnet34"
    return "fedper"


def to_model_names(tensors: Mapping[str, np.ndarray], layout: str) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under this toolkit's names (unknown names are kept as they are,
    so the mismatch report shows them; BatchNorm's integer counters are dropped)."""
    if layout != "timm-mobilenetv1":
        return {k: v for k, v in tensors.items() if not k.endswith("num_batches_tracked")}
    starts = np.cumsum((0, *TIMM_STAGE_REPEATS))
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if name.endswith("num_batches_tracked"):
            continue
        if name.startswith("conv_stem."):
            out["stem.conv." + name.removeprefix("conv_stem.")] = value
        elif name.startswith("bn1."):
            out["stem.bn." + name.removeprefix("bn1.")] = value
        elif (m := _TIMM_BLOCK.fullmatch(name)) and int(m[1]) < len(TIMM_STAGE_REPEATS):
            out[f"blocks.{int(starts[int(m[1])]) + int(m[2])}.{_TIMM_PART[m[3]]}.{m[4]}"] = value
        else:
            out[name] = value
    return out


def init_base(model: StagedModel, checkpoint: Checkpoint, kp: int) -> InitSource:
    """Load the checkpoint's tensors into the base of ``model`` (split at ``kp``), in place; for a
    model given by reference, into every layer (:func:`init_model_layout`)."""
    if checkpoint.layout == MODEL_LAYOUT:
        return init_model_layout(model, checkpoint)
    top = model.layer_groups()[-1]  # the classifier: in the base only at kp=0, and fresh there too
    state = model.state_dict()
    wanted = [n for n in split(model, kp).base if not any(n == p or n.startswith(p + ".") for p in top)]
    stem, own_stem = checkpoint.tensors.get("conv1.weight"), state.get("conv1.weight")
    hint = ""
    small_stem = stem is not None and own_stem is not None and tuple(stem.shape) != tuple(own_stem.shape)
    if checkpoint.model_name == "resnet34" and small_stem:
        hint = " (below 128 px the ResNet stem is 3x3; ImageNet checkpoints need --input-size 128 or more)"
    _check_fits(checkpoint, state, wanted, f"this model's base at kp={kp}", hint)
    named = checkpoint.tensors
    with torch.no_grad():
        for n in wanted:
            state[n].copy_(torch.from_numpy(np.ascontiguousarray(named[n], dtype=np.float32)))
    fresh = tuple(n for n in exchanged_names(model) if n not in set(wanted))
    return InitSource(str(checkpoint.path), checkpoint.sha256, checkpoint.layout, len(wanted), fresh)


def init_model_layout(model: StagedModel, checkpoint: Checkpoint) -> InitSource:
    """Load a state dict in the model's own layout, in place: every exchanged tensor but the
    classifier's must be there with the model's shape; the classifier's are taken where they all
    fit, else the classifier starts fresh (a checkpoint for other classes), said in ``notes``."""
    state = model.state_dict()
    named = checkpoint.tensors
    classifier = model.classifier_name()
    names = exchanged_names(model)
    top = [n for n in names if under(n, classifier)]
    wanted = [n for n in names if n not in set(top)]
    _check_fits(checkpoint, state, wanted, f"the model {checkpoint.model_name}")
    notes: list[str] = []
    absent = [n for n in top if n not in named]
    misshaped = [n for n in top if n in named and tuple(named[n].shape) != tuple(state[n].shape)]
    if absent or misshaped:
        if misshaped:
            n = misshaped[0]
            why = f"{n} is {tuple(named[n].shape)} in the checkpoint, {tuple(state[n].shape)} in the model"
        else:
            why = f"the checkpoint has no {absent[0]}"
        notes.append(f"the classifier {classifier} starts fresh: {why}")
    else:
        wanted += top
    with torch.no_grad():
        for n in wanted:
            state[n].copy_(torch.from_numpy(np.ascontiguousarray(named[n], dtype=np.float32)))
    fresh = tuple(n for n in names if n not in set(wanted))
    return InitSource(str(checkpoint.path), checkpoint.sha256, checkpoint.layout, len(wanted), fresh, tuple(notes))


def _check_fits(
    checkpoint: Checkpoint, state: Mapping[str, torch.Tensor], wanted: list[str], what: str, hint: str = ""
) -> None:
    named = checkpoint.tensors
    missing = [n for n in wanted if n not in named]
    misshaped = [n for n in wanted if n in named and tuple(named[n].shape) != tuple(state[n].shape)]
    if missing or misshaped:
        lines = [f"{n}: expected shape {tuple(state[n].shape)}, the checkpoint has {tuple(named[n].shape)}"
                 for n in misshaped[:SHOWN_MISMATCHES]]  # fmt: skip
        lines += [f"{n}: missing (expected shape {tuple(state[n].shape)})" for n in missing[:SHOWN_MISMATCHES]]
        raise CheckpointError(
            f"{checkpoint.path} ({checkpoint.layout} layout) does not fit {what}: {len(missing)} missing and "
            f"{len(misshaped)} misshaped of {len(wanted)} tensors{hint}; first: " + "; ".join(lines)
        )
