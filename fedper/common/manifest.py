"""The export manifest: what a device needs to know about the exported files.

It says which tensors are base (shared, on the wire) and which are head
(personal, never leave the device), how the training program's inputs and
outputs are laid out, how to prepare an input image, and the sha256 of every
artifact. Readers validate it with this schema.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Literal

import pydantic.dataclasses
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedper.common.atomic_write import atomic_write_text
from fedper.common.errors import FedperError
from fedper.common.train_config import TrainConfig

FORMAT = "fedper-manifest/1"
MANIFEST_FILE = "manifest.json"
# The manifest's JSON Schema, beside the protocol's: the Android core's ManifestKeys.java is generated from it.
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "manifest.schema.json"

# Artifact roles and their file names in an export directory.
ARTIFACT_FILES: dict[str, str] = {
    "training_program": "train.pte",
    "training_weights": "train.ptd",
    "inference_program": "infer.pte",
    "inference_weights": "infer.ptd",
    "onnx_model": "model.onnx",
    "initial_base": "base.safetensors",
    "initial_head": "head.safetensors",
}


class ManifestError(FedperError, ValueError):
    """A manifest that is missing, malformed or does not match its files."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorEntry(_Strict):
    name: str
    shape: list[int]
    dtype: Literal["float32"] = "float32"


class Tensors(_Strict):
    base: list[TensorEntry]
    head: list[TensorEntry]

    @model_validator(mode="after")
    def _disjoint(self) -> Tensors:
        base = {t.name for t in self.base}
        both = base & {t.name for t in self.head}
        if both:
            raise ValueError(f"tensors listed as both base and head: {sorted(both)[:3]}")
        if len(base) != len(self.base) or len({t.name for t in self.head}) != len(self.head):
            raise ValueError("a tensor name is listed twice")
        return self


class ModelSpec(_Strict):
    # mobilenet_v1, resnet34, torchvision:NAME or PACKAGE.MODULE:CALLABLE: what rebuilds the model
    # (a module given by reference must be importable where the manifest is read)
    name: str
    num_classes: int
    alpha: float
    input_size: int
    base: str = "model"
    linear_base_kp: int = 0
    head: Literal["softmax", "ordinal"] = "softmax"
    # The keyword arguments the reference was called with, as [key, JSON value] pairs (left out when none).
    model_args: list[tuple[str, Any]] = Field(default_factory=list)
    # Module paths named as the personal head (left out when kp counted the head's layers).
    head_modules: list[str] = Field(default_factory=list)


class Normalization(_Strict):
    """x = (pixel / 255 - mean[c]) / std[c], per RGB channel."""

    mean: list[float] = Field(min_length=3, max_length=3)
    std: list[float] = Field(min_length=3, max_length=3)


class InputSpec(_Strict):
    shape: list[int | None]  # None: the batch dimension
    layout: Literal["NCHW"] = "NCHW"
    dtype: Literal["float32"] = "float32"
    channels: Literal["RGB"] = "RGB"
    normalization: Normalization


class OutputSpec(_Strict):
    kind: Literal["logits"] = "logits"
    num_classes: int
    labels: list[str] | None = None


class TrainingProgramSpec(_Strict):
    """How to call the training program's method (loss first, then the new BN statistics)."""

    method: str = "forward"
    inputs: list[str]  # "x", "y", then one running statistic per entry of bn_statistics
    outputs: list[str]  # "loss", then the updated statistics in the same order
    bn_statistics: list[str]
    parameters: list[str]  # trainable tensors, as named by the program
    min_batch: int = 2
    max_batch: int
    variant: Literal["fast", "plain"]


class InferenceProgramSpec(_Strict):
    method: str = "forward"
    batch: int = 1
    weights: list[str]  # every tensor the inference weights file must hold


# The training settings a device uses where its task does not say otherwise: a TrainConfig (its
# fields, defaults and checks, declared once) and what the program was built for. (A comment, not a
# docstring: the schema, generated from this module, would carry it.)
@pydantic.dataclasses.dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TrainingDefaults(TrainConfig):
    loss: Literal["cross_entropy"] = "cross_entropy"
    optimizer: Literal["sgd"] = "sgd"
    trainable: Literal["all", "head"] = "all"


class RuntimeSpec(_Strict):
    """What wrote the programs: a device refuses programs its runtime cannot load."""

    executorch: str  # version of the executorch package that wrote the .pte/.ptd files
    onnx_opset: int  # the opset model.onnx was exported with


class Manifest(_Strict):
    format: Literal["fedper-manifest/1"] = "fedper-manifest/1"
    created_by: str
    model: ModelSpec
    kp: int
    input: InputSpec
    output: OutputSpec
    tensors: Tensors
    training_program: TrainingProgramSpec
    inference_program: InferenceProgramSpec
    training: TrainingDefaults
    artifacts: dict[str, str]
    sha256: dict[str, str]
    runtime: RuntimeSpec | None = None  # absent in manifests written before it existed

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for role, name in self.artifacts.items():
            if "/" in name or "\\" in name or name.startswith("."):
                raise ValueError(f"artifact {role!r} has an unsafe file name {name!r}")
            if name not in self.sha256:
                raise ValueError(f"artifact {name!r} has no sha256")
        if self.training.trainable == "head" and not self.tensors.head:
            raise ValueError("training only the head needs kp >= 1 (the head is empty)")
        return self

    @property
    def base_names(self) -> list[str]:
        return [t.name for t in self.tensors.base]

    @property
    def head_names(self) -> list[str]:
        return [t.name for t in self.tensors.head]

    def layout(self, part: Literal["base", "head"]) -> list[tuple[str, tuple[int, ...]]]:
        entries = self.tensors.base if part == "base" else self.tensors.head
        return [(t.name, tuple(t.shape)) for t in entries]

    def to_json(self) -> str:
        """The manifest as written; an unknown ``runtime`` is left out rather than null, and so are
        the model's empty ``model_args`` and ``head_modules`` (a named model's manifest reads as
        before they existed)."""
        exclude: dict[str, Any] = {"runtime": True} if self.runtime is None else {}
        empty = {name: True for name in ("model_args", "head_modules") if not getattr(self.model, name)}
        if empty:
            exclude["model"] = empty
        return self.model_dump_json(indent=2, exclude=exclude or None) + "\n"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(directory: Path, verify_files: bool = True) -> Manifest:
    """Load and validate ``manifest.json``; optionally check every artifact's sha256."""
    path = Path(directory) / MANIFEST_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        manifest = Manifest.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
    except ValidationError as exc:
        raise ManifestError(f"{path} does not match {FORMAT}: {exc}") from exc
    if verify_files:
        for name, digest in manifest.sha256.items():
            file = Path(directory) / name
            if not file.is_file():
                raise ManifestError(f"{path} names {name}, which is missing from {directory}")
            if sha256_file(file) != digest:
                raise ManifestError(f"{file} does not match the sha256 in {path}")
    return manifest


def write_manifest(directory: Path, manifest: Manifest) -> None:
    atomic_write_text(Path(directory) / MANIFEST_FILE, manifest.to_json())


def schema() -> dict[str, Any]:
    """JSON Schema of ``manifest.json``, for apps and tools in other languages."""
    body = Manifest.model_json_schema(ref_template="#/$defs/{model}")
    body.pop("title", None)
    body.pop("description", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"FedPer export manifest ({FORMAT})",
        "description": "Generated by `python -m fedper.common.manifest` from fedper/common/manifest.py; do not edit.",
        **body,
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_text())
    print(f"wrote {SCHEMA_FILE}", file=sys.stderr)
