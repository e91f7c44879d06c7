"""A cache of lowered programs, keyed by everything that determines their bytes.

Lowering the training program is most of an export (``bench.export_time``); the same model,
weights, code and library versions always give the same files, so a second export of it copies
them. An entry is a directory of the program files and ``entry.json`` with their sha256s; a
file that does not match is a miss (the entry is dropped and the export runs), never a wrong
program.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import torch

import fedper
from fedper import export
from fedper.common.atomic_write import atomic_directory, atomic_write_text
from fedper.common.manifest import sha256_file
from fedper.models import ModelConfig
from fedper.models.reference import source_digest as source_digest_of

ENTRY_FILE = "entry.json"
KEY_FORMAT = "fedper-export-cache/1"
# Packages whose versions the programs depend on (the lowering, the ONNX exporter, torchvision's models).
LIBRARIES = ("torch", "executorch", "onnx", "onnxscript", "torchvision")
# The namespace's application packages (only ``export`` of them builds programs).
APPLICATIONS = ("server", "device_runtime", "export", "_recipes")


def default_cache_dir() -> Path:
    """``$FEDPER_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedper/exports``, else ``~/.cache/fedper/exports``."""
    if os.environ.get("FEDPER_CACHE_DIR"):
        return Path(os.environ["FEDPER_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fedper" / "exports"


def source_digest() -> str:
    """sha256 over the toolkit's Python sources that build and lower a model (``export/`` and
    ``fedper/``): any edit there is a new key, whether or not it changes the programs."""
    digest = hashlib.sha256()
    for package in (export, fedper):
        root = Path(package.__file__).parent  # type: ignore[arg-type]
        for path in sorted(root.rglob("*.py")):
            if package is fedper and path.relative_to(root).parts[0] in APPLICATIONS:
                continue  # in a wheel these are folders; in the repository, links rglob does not follow
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def weights_digest(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in order."""
    digest = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except Exception:
        return None


def program_key(model_config: ModelConfig, variant: str, max_batch: int, state: Mapping[str, torch.Tensor]) -> str:
    """The cache key of an export's programs: what the lowering is given, the weights in them,
    the code and library versions that lower them (and, for a model given by reference, its
    module's source: an edited forward is another program), and the CPU kernel set (which could
    change a value computed while exporting)."""
    described = {
        "format": KEY_FORMAT,
        "model": asdict(model_config),
        "model_source": source_digest_of(model_config.name),
        "variant": variant,
        "max_batch": max_batch,
        "weights": weights_digest(state),
        "source": source_digest(),
        "libraries": {name: _installed(name) for name in LIBRARIES},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class ExportCache:
    """Entries under ``root``, the ``keep`` most recently used kept."""

    root: Path
    keep: int = 8

    def fetch(self, key: str, into: Path, names: Iterable[str]) -> bool:
        """Copy the entry's files into ``into``; False (and the entry dropped) when there is no
        complete, intact entry."""
        entry = self.root / key
        if not entry.is_dir():
            return False
        try:
            recorded = json.loads((entry / ENTRY_FILE).read_text())["files"]
            names = list(names)
            if sorted(recorded) != sorted(names):
                raise ValueError("other files")
            for name in names:
                shutil.copyfile(entry / name, into / name)
                if sha256_file(into / name) != recorded[name]:
                    raise ValueError(f"{name} does not match its sha256")
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry)
            return False
        with contextlib.suppress(OSError):
            os.utime(entry)
        return True

    def store(self, key: str, source: Path, names: Iterable[str]) -> None:
        """Add an entry (atomically) from ``source``'s files, then drop the least recently used
        beyond ``keep``."""
        with atomic_directory(self.root / key) as staging:
            files = {}
            for name in names:
                shutil.copyfile(source / name, staging / name)
                files[name] = sha256_file(staging / name)
            atomic_write_text(staging / ENTRY_FILE, json.dumps({"files": files}, indent=1))
        entries = sorted(
            (p for p in self.root.iterdir() if _is_entry(p)),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for stale in entries[self.keep :]:
            shutil.rmtree(stale, ignore_errors=True)


def _is_entry(path: Path) -> bool:
    """A directory this cache made (a hex key holding ``entry.json``): ``--cache`` may name a
    directory that holds other things, which pruning must never touch."""
    return len(path.name) == 64 and all(c in "0123456789abcdef" for c in path.name) and (path / ENTRY_FILE).is_file()
