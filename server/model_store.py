"""Published model versions: the files ``models/v{N}.safetensors`` and the rows that record them.

Versions only ever grow: a rollback republishes an old version's tensors as a new one, so a device
that cached a version never sees it change. A file is written durably before its row is
recorded; a crash between leaves a file that the next start removes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedper.common import weights
from fedper.common.atomic_write import atomic_write_bytes, fsync_directory
from fedper.common.manifest import sha256_file
from fedper.common.weights import TensorSpec
from fedper.server.storage import Database
from fedper.server.update_store import UpdateStore

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class StagedVersion:
    """A new version's file, written durably in ``tmp/``, not yet in ``models/``."""

    path: Path
    sha256: str


class ModelStore:
    def __init__(self, db: Database, models_dir: Path, layout: list[TensorSpec], files: UpdateStore) -> None:
        self.db, self.dir, self.layout, self._files = db, models_dir, layout, files
        self._bases: dict[int, Tensors] = {}  # float64, for the update bound and the aggregation

    def path(self, version: int) -> Path:
        return self.dir / f"v{version}.safetensors"

    def file(self, version: int) -> tuple[Path, str] | None:
        """Where version ``version`` is and its sha256, if it is recorded."""
        row = self.db.versions.get(version)
        if row is None:
            return None
        return self.dir / row.file, row.sha256

    def write_initial(self, initial_base: Path) -> tuple[Path, str]:
        """Version 0, the export's base: served as is, so it must load with the manifest's layout."""
        weights.load_checked([initial_base], self.layout)
        target = self.path(0)
        atomic_write_bytes(target, initial_base.read_bytes())
        return target, sha256_file(target)

    @contextlib.contextmanager
    def staged(self, tensors: Mapping[str, np.ndarray]) -> Iterator[StagedVersion]:
        """A new version's file in ``tmp/`` (removed on exit unless :meth:`place` moved it)."""
        with self._files.temp_file(".safetensors") as (path, f):
            weights.write_float32(f, dict(tensors))
            f.flush()
            os.fsync(f.fileno())
            yield StagedVersion(path, sha256_file(path))

    @contextlib.contextmanager
    def staged_bytes(self, data: bytes, source: str) -> Iterator[StagedVersion]:
        """Another server's published version (a regional server's root) in ``tmp/``, checked
        with the loader against the manifest's layout first (WeightsError naming ``source``)."""
        with self._files.temp_file(".safetensors") as (path, f):
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            try:
                weights.load_checked([path], self.layout)
            except weights.WeightsError as exc:
                raise weights.WeightsError(f"{source}: {exc}") from exc
            yield StagedVersion(path, sha256_file(path))

    def place(self, staged: StagedVersion, version: int) -> Path:
        """Move a staged file into place as version ``version`` (in the transaction that records
        it, after the closer's fencing check)."""
        target = self.path(version)
        os.replace(staged.path, target)
        fsync_directory(self.dir)
        return target

    def copy(self, source: Path, version: int) -> Path:
        target = self.path(version)
        atomic_write_bytes(target, source.read_bytes())
        return target

    def base(self, version: int) -> Tensors:
        """Version ``version``'s tensors in float64 (the newest one read is kept)."""
        if version not in self._bases:
            found = self.file(version)
            if found is None:
                raise KeyError(version)
            self._bases = {version: {k: v.astype(np.float64) for k, v in weights.load(found[0]).items()}}
        return self._bases[version]

    def last_step(self, version: int) -> Tensors | None:
        """The published step that made ``version`` (its base minus its parent's), where centered
        clipping starts; None (clip around the base) for version 0 or a pruned parent."""
        parent = self.db.versions.parent(version)
        found = self.file(version)
        parent_file = self.file(parent) if parent is not None else None
        if found is None or parent_file is None:
            return None
        after, before = weights.load(found[0]), weights.load(parent_file[0])
        return {k: after[k].astype(np.float64) - before[k].astype(np.float64) for k in after}

    def forget(self, versions: list[int]) -> None:
        """Remove pruned versions' files (their rows are gone already)."""
        self._bases = {k: b for k, b in self._bases.items() if k not in versions}
        for v in versions:
            self._files.remove(self.path(v))

    def remove_unrecorded(self, shared: bool = False) -> None:
        """At start: temp files of writes a crash interrupted (``.v1.safetensors.*.tmp``), version
        files written but never recorded, and files of versions pruned before a crash. ``shared``:
        other processes use the directory, and a version newer than the newest recorded one may be
        being placed by one of them (it is recorded in the same transaction)."""
        versions = self.db.versions.files()
        recorded = {self.dir / file for file in versions.values()}
        newest = max(versions, default=0)
        for path in list(self.dir.iterdir()):
            if path in recorded or not (path.name.endswith(".tmp") or path.suffix == ".safetensors"):
                continue
            number = path.stem[1:] if path.name.startswith("v") else ""
            if shared and (path.name.endswith(".tmp") or (number.isdigit() and int(number) > newest)):
                continue
            self._files.remove(path)
        for path in [] if shared else list(self.dir.parent.glob(".*.tmp")):  # the secrets' atomic writes
            self._files.remove(path)
