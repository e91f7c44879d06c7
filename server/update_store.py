"""The blob side of updates: temporary files, canonical update files, quarantine.

Temporary files (request bodies, canonical files being written) live in ``tmp/``, never in a
round's folder, so closing a round can always remove its folder. A round's folder
``updates/r<R>/`` is created only when an update is accepted into it. Removing files never
raises into a request: a failure is logged and the leftover is removed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from fedper.common import weights
from fedper.common.atomic_write import fsync_directory
from fedper.common.manifest import sha256_file
from fedper.common.weights import TensorSpec, WeightsError

log = logging.getLogger("fedper.server")


class UpdateStore:
    def __init__(self, data_dir: Path, layout: list[TensorSpec]):
        self.updates_dir = data_dir / "updates"
        self.tmp_dir = data_dir / "tmp"
        self.quarantine_dir = data_dir / "quarantine"
        self._layout = layout
        for d in (self.updates_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)

    # --- temporary files ----------------------------------------------------------------

    @contextlib.contextmanager
    def temp_file(self, suffix: str) -> Iterator[tuple[Path, BinaryIO]]:
        """An open temporary file in ``tmp/``, removed on exit unless it was renamed away."""
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, suffix=suffix)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                yield path, f
        finally:
            self.remove(path)

    def write_canonical(self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> Path:
        """Our own encoding of checked tensors in ``tmp/``, durable, and readable by the loader."""
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, suffix=".update")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                weights.write_to(f, tensors, metadata)
                f.flush()
                os.fsync(f.fileno())
            self._check_header(path)
        except BaseException:
            self.remove(path)
            raise
        return path

    def _check_header(self, path: Path) -> None:
        """The loader's reading of the names, shapes and dtype (cheap: the header only)."""
        try:
            with safe_open(str(path), framework="numpy") as f:
                found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
                dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        except SafetensorError as exc:
            raise WeightsError(f"{path}: the canonical update cannot be read back: {exc}") from exc
        if found != dict(self._layout) or dtypes - {"F32"}:
            raise WeightsError(f"{path}: the canonical update does not have the manifest's layout")

    # --- accepted updates ---------------------------------------------------------------

    def commit(self, temp: Path, number: int, device_id: str) -> str:
        """Move a canonical file into round ``number``'s folder; returns its name relative to ``updates/``."""
        round_dir = self.updates_dir / f"r{number}"
        final = round_dir / f"{device_id}.safetensors"
        for attempt in (1, 2):  # another process may remove the folder it left empty in between
            round_dir.mkdir(exist_ok=True)
            try:
                os.replace(temp, final)
                break
            except FileNotFoundError:
                if attempt == 2 or not temp.exists():
                    raise
        fsync_directory(round_dir)
        return f"r{number}/{final.name}"

    def forwarded_sum(self, number: int) -> str:
        """Where a regional server keeps round ``number``'s sum until the root has it (relative to
        ``updates/``; it goes with the round's folder)."""
        return f"r{number}/forward.sum"

    def digest(self, relative: str) -> str:
        """The sha256 of a stored update's file: a key that depends on its content only."""
        return sha256_file(self.updates_dir / relative)

    def load(self, relative: str) -> dict[str, np.ndarray]:
        """A stored update, read by the library and checked against the manifest (WeightsError if not)."""
        path = self.updates_dir / relative
        tensors = weights.load(path)
        weights.check_layout(tensors, self._layout, str(path))
        return tensors

    def quarantine(self, relative: str, reason: str) -> None:
        """Move an unloadable stored update aside (kept for the operator to inspect)."""
        source = self.updates_dir / relative
        if not source.exists():
            return
        target = self.quarantine_dir / f"{relative.replace('/', '-')}.{int(time.time())}"
        log.warning(json.dumps({"event": "update_quarantined", "file": relative, "to": str(target),
                                "reason": reason[:300]}))  # fmt: skip
        try:
            self.quarantine_dir.mkdir(exist_ok=True)
            os.replace(source, target)
        except OSError as exc:  # then it is an unrecorded file, removed with the other leftovers
            log.warning(json.dumps({"event": "cleanup_failed", "path": str(source), "error": str(exc)}))

    # --- cleanup (never raises) ----------------------------------------------------------

    def remove(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(json.dumps({"event": "cleanup_failed", "path": str(path), "error": str(exc)}))

    def remove_file(self, relative: str) -> None:
        """Remove one stored update, and its round's folder if that leaves it empty (caller holds
        the round lock, so nothing is being moved into it)."""
        path = self.updates_dir / relative
        self.remove(path)
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    def remove_tree(self, path: Path) -> None:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(json.dumps({"event": "cleanup_failed", "path": str(path), "error": str(exc)}))

    def remove_round(self, number: int) -> None:
        """Delete round ``number``'s folder once its updates are aggregated or discarded."""
        self.remove_tree(self.updates_dir / f"r{number}")

    def remove_leftovers(self, open_round: int | None, referenced: set[str], min_age: float = 0.0) -> None:
        """At start: temp files of a crashed process, folders of finished rounds, unrecorded files.
        ``min_age``: other processes share the directory (docs/SCALING.md), and files younger than
        this may be theirs, in flight."""
        for path in list(self.tmp_dir.iterdir()):
            if _older(path, min_age):
                self.remove_tree(path)
        for round_dir in list(self.updates_dir.iterdir()):
            if round_dir.name != f"r{open_round}" or not round_dir.is_dir():
                self.remove_tree(round_dir)
                continue
            for path in list(round_dir.iterdir()):
                if f"{round_dir.name}/{path.name}" not in referenced and _older(path, min_age):
                    self.remove(path)


def _older(path: Path, seconds: float) -> bool:
    """Whether ``path`` was last changed more than ``seconds`` ago (gone: no)."""
    if seconds <= 0:
        return True
    try:
        return time.time() - path.lstat().st_mtime > seconds
    except FileNotFoundError:
        return False
