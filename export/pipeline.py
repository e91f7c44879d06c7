"""``fedper export``: a model and its split in, the files a phone needs out (atomically)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedper import __version__
from fedper.checkpoints import MODEL_LAYOUT, InitSource, init_base, read_checkpoint
from fedper.common import weights
from fedper.common.atomic_write import atomic_directory
from fedper.common.config_cli import nested, option
from fedper.common.errors import ConfigError
from fedper.common.manifest import (
    ARTIFACT_FILES,
    MANIFEST_FILE,
    InferenceProgramSpec,
    InputSpec,
    Manifest,
    ModelSpec,
    Normalization,
    OutputSpec,
    RuntimeSpec,
    TensorEntry,
    Tensors,
    TrainingDefaults,
    TrainingProgramSpec,
    read_manifest,
    sha256_file,
    write_manifest,
)
from fedper.common.train_config import TrainConfig
from fedper.data import dataset_info
from fedper.data.dataset import DEFAULT_MEAN, DEFAULT_STD
from fedper.export.channel_major import ChannelMajorStep
from fedper.export.executorch_lowering import lower_inference_program, lower_training_program
from fedper.export.export_cache import ExportCache, default_cache_dir, program_key
from fedper.export.onnx_export import ONNX_OPSET, export_onnx
from fedper.export.training_graph import (
    Variant,
    VariantChoice,
    resolve_variant,
    training_step,
)
from fedper.models import MODEL_NAMES, ModelConfig, StagedModel, build_model, exchanged_state, split
from fedper.pretrained import INIT_HELP, checkpoint_path

PROGRAM_ROLES = (
    "training_program",
    "training_weights",
    "inference_program",
    "inference_weights",
    "onnx_model",
)
PROGRAM_FILES = tuple(ARTIFACT_FILES[role] for role in PROGRAM_ROLES)


class ExportConfigError(ConfigError):
    """Export options that cannot work together."""


@dataclass(frozen=True)
class ExportConfig:
    """What to export; every setting has its command-line option of the same name."""

    # --dataset, when given, sets the classes; the export has no linear base.
    model: ModelConfig = nested(ModelConfig, skip=("base", "linear_base_kp"))
    kp: int = option(2, "personal layers from the top (0 = FedAvg, 1 = classifier, ...)")
    out: Path = option(Path("artifacts"), "output directory (replaced atomically)")
    weights: tuple[Path, ...] = option(
        (), "initial weights: safetensors file(s), e.g. a simulation's final base, or a server "
        "model version's base plus a device's head",
    )  # fmt: skip
    train: Literal["all", "head"] = option("all", "what devices train by default: all tensors or only the head")
    from_dir: Path | None = option(
        None, "re-partition an existing export for another --kp, reusing its programs",
        flags=("--from",), metavar="DIR",
    )  # fmt: skip
    dataset: str | None = option(
        None, "dataset the model is for: sets normalization, labels and --num-classes",
        metavar="NAME",
    )  # fmt: skip
    variant: VariantChoice = option(
        "auto", "training graph: fast (convolutions as matrix products, any model), plain (ExecuTorch's stock "
        "nn.Conv2d program, for comparison), auto (fast)",
    )  # fmt: skip
    max_batch: int = option(64, "largest batch the training program accepts")
    training: TrainConfig = nested(TrainConfig, "the default written to the manifest")
    seed: int = option(0, "seed for the initial weights (when --weights is not given)")
    init: Path | None = option(None, f"the base's initial weights: {INIT_HELP} (from --seed)", metavar="PATH")
    cache: Path | None = option(
        None, "export cache: programs lowered before for the same model, weights, code and library "
        "versions are copied from it (default: $FEDPER_CACHE_DIR, else ~/.cache/fedper/exports)",
        metavar="DIR",
    )  # fmt: skip
    bypass_cache: bool = option(False, "lower every program, neither reading nor writing the export cache")
    list_layers: bool = option(
        False, "print the model's layer groups (the index, the kp that makes each personal, its module paths and "
        "parameters) and exit without exporting",
    )  # fmt: skip


def export_model_config(config: ExportConfig) -> ModelConfig:
    """The model an export builds: ``--dataset``, when given, sets its classes."""
    info = dataset_info(config.dataset) if config.dataset else None
    return replace(config.model, num_classes=info.num_classes) if info else config.model


@dataclass(frozen=True)
class ExportReport:
    out: Path
    sizes: dict[str, int]
    seconds: dict[str, float]
    manifest: Manifest
    notes: tuple[str, ...] = ()  # what the user should know about the export (e.g. a classifier started fresh)
    warnings: tuple[str, ...] = ()  # what makes the program slower than it could be (e.g. the stock program)


Progress = Callable[[str], None]


ProgramCheck = Callable[[Path, Manifest], None]


def run_export(
    config: ExportConfig, progress: Progress | None = None, check: ProgramCheck | None = None
) -> ExportReport:
    """Write the export into ``config.out``; on any error nothing is left behind.

    ``check`` (what runs the programs, e.g. the device runtime's, passed in by whoever composes
    export and device: the command line, the demo, the tests) verifies the staged export before
    it replaces ``config.out``: a program a device cannot load is never published.
    """
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    source = read_manifest(config.from_dir) if config.from_dir is not None else None
    if source is not None:
        mcfg = ModelConfig(**source.model.model_dump())
        labels = source.output.labels
        norm = source.input.normalization
        variant: Variant = source.training_program.variant
    else:
        info = dataset_info(config.dataset) if config.dataset else None
        mcfg = export_model_config(config)
        labels = list(info.labels) if info and info.labels else None
        norm = Normalization(
            mean=list(info.mean if info else DEFAULT_MEAN),
            std=list(info.std if info else DEFAULT_STD),
        )
    model = build_model(mcfg, seed=config.seed)
    notes: list[str] = []
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        say(f"warning: {message}")

    if model.head_modules and config.kp not in (0, 1):
        notes.append(f"--head-modules names the head ({', '.join(model.head_modules)}): kp {config.kp} is taken as 1")
    if source is None:
        variant = resolve_variant(config.variant, model, warn=warn)
        check_output(model, mcfg)
    split(model, config.kp)  # kp out of range: a clear error before any work
    if config.train == "head" and config.kp == 0:
        raise ExportConfigError("--train head needs kp >= 1: with kp=0 the head is empty")
    if config.training.batch_size > config.max_batch:
        raise ExportConfigError(f"--batch-size must be in 2..{config.max_batch}")
    init_source = load_initial_weights(model, config, source, say)
    if init_source is not None:
        notes += init_source.notes
    step = training_step(model, variant)
    if isinstance(step, ChannelMajorStep):
        for fallback in step.fallbacks_at(mcfg.input_size):
            warn(fallback.warning())
    cache = None if config.bypass_cache or source is not None else ExportCache(config.cache or default_cache_dir())
    key = program_key(mcfg, variant, config.max_batch, model.state_dict()) if cache is not None else ""

    with atomic_directory(config.out) as staging:
        if source is not None and config.from_dir is not None:
            for role in PROGRAM_ROLES:
                shutil.copyfile(config.from_dir / source.artifacts[role], staging / ARTIFACT_FILES[role])
            seconds["copy programs"] = time.perf_counter() - start
        elif cache is not None and cache.fetch(key, staging, PROGRAM_FILES):
            say("programs copied from the export cache")
            seconds["programs from the cache"] = time.perf_counter() - start
        else:
            t = time.perf_counter()
            say("exporting the training program (forward + backward)...")
            lowered = lower_training_program(step, mcfg.input_size, config.max_batch)
            (staging / ARTIFACT_FILES["training_program"]).write_bytes(lowered.program)
            (staging / ARTIFACT_FILES["training_weights"]).write_bytes(lowered.weights)
            seconds["training program"] = time.perf_counter() - t
            t = time.perf_counter()
            say("exporting the inference program...")
            lowered = lower_inference_program(model, mcfg.input_size)
            (staging / ARTIFACT_FILES["inference_program"]).write_bytes(lowered.program)
            (staging / ARTIFACT_FILES["inference_weights"]).write_bytes(lowered.weights)
            seconds["inference program"] = time.perf_counter() - t
            t = time.perf_counter()
            say("exporting ONNX...")
            onnx_model = export_onnx(model, mcfg.input_size, list(exchanged_state(model)), ONNX_OPSET)
            (staging / ARTIFACT_FILES["onnx_model"]).write_bytes(onnx_model)
            seconds["onnx"] = time.perf_counter() - t
            if cache is not None:
                try:
                    cache.store(key, staging, PROGRAM_FILES)
                except OSError as exc:  # a full disk costs the next export its shortcut, not this one
                    say(f"could not store the programs in the export cache {cache.root}: {exc}")
        # Copied programs keep the runtime that wrote them (unknown for exports made before
        # manifests recorded it).
        runtime = source.runtime if source is not None else current_runtime()
        manifest = write_weights_and_manifest(staging, model, mcfg, config, variant, norm, labels, runtime)
        write_manifest(staging, manifest)
        if check is not None:
            t = time.perf_counter()
            say("checking the training program's metadata...")
            check(staging, manifest)
            seconds["check"] = time.perf_counter() - t
        sizes = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
    seconds["total"] = time.perf_counter() - start
    assert MANIFEST_FILE in sizes
    return ExportReport(
        out=config.out, sizes=sizes, seconds=seconds, manifest=manifest, notes=tuple(notes), warnings=tuple(warnings)
    )


def check_output(model: StagedModel, mcfg: ModelConfig) -> None:
    """A model given by reference must map a batch of images to one score per class: checked on
    two zero images (eval mode) before minutes of lowering, with what it returned instead."""
    if mcfg.name in MODEL_NAMES:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, 3, mcfg.input_size, mcfg.input_size))
    except Exception as exc:
        raise ExportConfigError(f"--model {mcfg.name}: its forward fails on a (2, 3, {mcfg.input_size}, "
                                f"{mcfg.input_size}) batch: {type(exc).__name__}: {exc}") from exc  # fmt: skip
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, mcfg.num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ExportConfigError(
            f"--model {mcfg.name}: for a (2, 3, {mcfg.input_size}, {mcfg.input_size}) batch its forward must "
            f"return a tensor of shape (2, {mcfg.num_classes}), got {got}"
        )


def write_weights_and_manifest(
    directory: Path,
    model: StagedModel,
    mcfg: ModelConfig,
    config: ExportConfig,
    variant: Variant,
    norm: Normalization,
    labels: list[str] | None,
    runtime: RuntimeSpec | None,
) -> Manifest:
    """Write the initial base/head safetensors and return the manifest of ``directory``
    (the program files must be there already: their sha256 goes into the manifest)."""
    state = exchanged_state(model)
    model_split = split(model, config.kp)
    step = training_step(model, variant)
    weights.save(directory / ARTIFACT_FILES["initial_base"], {n: state[n] for n in model_split.base})
    weights.save(directory / ARTIFACT_FILES["initial_head"], {n: state[n] for n in model_split.head})
    return Manifest(
        created_by=f"fedper {__version__}",
        model=ModelSpec(**mcfg.to_dict()),
        kp=model_split.kp,
        input=InputSpec(shape=[None, 3, mcfg.input_size, mcfg.input_size], normalization=norm),
        output=OutputSpec(num_classes=mcfg.num_classes, labels=labels),
        tensors=Tensors(
            base=[_entry(n, state[n]) for n in model_split.base],
            head=[_entry(n, state[n]) for n in model_split.head],
        ),
        training_program=TrainingProgramSpec(
            inputs=["x", "y", *step.stat_names],
            outputs=["loss", *step.stat_names],
            bn_statistics=step.stat_names,
            parameters=[n for n, _ in step.named_parameters()],
            max_batch=config.max_batch,
            variant=variant,
        ),
        inference_program=InferenceProgramSpec(weights=list(state)),
        training=TrainingDefaults(
            **asdict(config.training),
            trainable=config.train,
        ),
        artifacts=dict(ARTIFACT_FILES),
        sha256={name: sha256_file(directory / name) for name in ARTIFACT_FILES.values()},
        runtime=runtime,
    )


def current_runtime() -> RuntimeSpec:
    """The ExecuTorch package writing this export's programs, and the ONNX opset it uses."""
    return RuntimeSpec(executorch=version("executorch"), onnx_opset=ONNX_OPSET)


def _entry(name: str, tensor: torch.Tensor) -> TensorEntry:
    return TensorEntry(name=name, shape=list(tensor.shape))


def load_initial_weights(
    model: StagedModel, config: ExportConfig, source: Manifest | None, say: Progress = lambda _m: None
) -> InitSource | None:
    """The exported initial weights, in place: the seed's, a checkpoint's base (``--init``; where
    it came from is returned), given weight files (``--weights``) or the re-partitioned export's
    (``--from``)."""
    full_layout = [(n, tuple(t.shape)) for n, t in exchanged_state(model).items()]
    init = checkpoint_path(config.init)
    if init is not None and (config.weights or config.from_dir is not None):
        raise ExportConfigError("--init starts a new model's base: it cannot be combined with --weights or --from")
    base_source = None
    if init is not None:
        base_source = init_base(model, read_checkpoint(init, config.model.name), config.kp)
        own = base_source.layout == MODEL_LAYOUT
        fresh = "; ".join(base_source.notes) if own else "head fresh"
        say(f"{'weights' if own else 'base'} from {config.init} ({base_source.layout} layout, {base_source.tensors} "
            f"tensors, sha256 {base_source.sha256[:12]}){'; ' + fresh if fresh else ''}")  # fmt: skip
    if config.weights:
        _load_into(model, weights.load_checked(list(config.weights), full_layout))
    elif source is not None and config.from_dir is not None:
        files = [config.from_dir / source.artifacts[r] for r in ("initial_base", "initial_head")]
        _load_into(model, weights.load_checked(files, full_layout))
    return base_source


def _load_into(model: StagedModel, tensors: Mapping[str, np.ndarray]) -> None:
    state = model.state_dict()
    with torch.no_grad():
        for name, value in tensors.items():
            state[name].copy_(torch.as_tensor(value))


def write_server_only_export(out: Path, alpha: float = 1.0, kp: int = 2, seed: int = 0) -> Path:
    """An export directory with the real manifest and weights of MobileNet-V1 at ``alpha``
    but placeholder program files: everything the server needs (it serves programs as
    opaque files), without minutes of lowering. For load tests of the server and the Android
    core's host tests; its ``runtime`` is what a real export with this install would record."""
    out.mkdir(parents=True)
    for role in PROGRAM_ROLES:
        (out / ARTIFACT_FILES[role]).write_bytes(b"placeholder program: served, never run")
    mcfg = ModelConfig(alpha=alpha, input_size=32)
    model = build_model(mcfg, seed=seed)
    norm = Normalization(mean=list(DEFAULT_MEAN), std=list(DEFAULT_STD))
    config = ExportConfig(model=mcfg, kp=kp, out=out)
    write_manifest(out, write_weights_and_manifest(out, model, mcfg, config, "fast", norm, None, current_runtime()))
    return out
