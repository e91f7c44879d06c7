"""Crash-safe file and directory writes: write beside the target, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_directory(path: Path) -> None:
    """Persist a rename: fsync the directory that holds the entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield an open temporary file beside ``path`` that replaces it only if the block succeeds.

    For writers that stream (a file too large to build in memory first); on exit the file is
    flushed, fsynced and renamed over ``path``, and the directory fsynced. On an exception
    ``path`` is untouched and the temporary file removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so readers see the old file or the new one, never half."""
    with atomic_writer(path, mode) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def make_parent(target: Path) -> Path:
    """The directory that will hold output directory ``target``, created if need be; an
    ``OSError`` naming ``target`` if it cannot be."""
    parent = Path(target).absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create the output directory {Path(target).absolute()}: {exc.strerror}") from exc
    return parent


@contextlib.contextmanager
def atomic_directory(target: Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a staging directory that becomes ``target`` only if the block succeeds.

    A failure leaves ``target`` as it was (absent, or the previous complete version).
    """
    target = Path(target).absolute()
    parent = make_parent(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists")
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory")
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"cannot write into {parent}: permission denied")
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.", suffix=".partial"))
    try:
        yield staging
        old = None
        if target.exists():
            old = parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, old)
        os.replace(staging, target)
        fsync_directory(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
