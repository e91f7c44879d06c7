"""Whether the data directory's disk has room for a round, and the server's draining state.

A server whose disk fills must not half-write a version, nor accept updates it cannot store
or aggregate (a round would stay open past ``target_clients`` while version v+1 cannot be
written). It drains instead: downloads, status and round information keep working; tasks
answer 204, enrollments and uploads 503 ``server_busy`` with a Retry-After; rounds neither
close nor are abandoned. It leaves draining by itself once the disk has room again.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

from fedper.server.storage import StorageFullError

MIB = 1024 * 1024
MARGIN = 64 * MIB  # SQLite's WAL, logs, request bodies of uploads being refused


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, or the database's error) says the disk is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, StorageFullError):
        return True
    text = str(exc).lower()
    return "database or disk is full" in text or "no space left" in text


class DiskRoom:
    """At least ``reserve`` bytes free on the disk of ``path`` (``free`` measures them)."""

    def __init__(self, path: Path, reserve: int, free: Callable[[], int] | None = None):
        self.path, self.reserve = path, reserve
        self._free = free or (lambda: shutil.disk_usage(path).free)

    def free_bytes(self) -> int | None:
        """The bytes free now (None: they cannot be measured)."""
        try:
            return self._free()
        except OSError:
            return None

    def shortage(self) -> str | None:
        """Why the disk is too full for a round, or None."""
        try:
            free = self._free()
        except OSError as exc:
            return f"cannot measure the free space of {self.path}: {exc}"
        if free < self.reserve:
            return (f"{self.path} has {free / MIB:.1f} MiB free, less than the {self.reserve / MIB:.1f} MiB a round "
                    "needs (--min-free-mib)")  # fmt: skip
        return None


def round_reserve(slots: int, version_bytes: int, min_free_mib: float) -> int:
    """Bytes a round needs: the operator's figure, or room for every slot's update, two versions
    and a margin."""
    if min_free_mib:
        return int(min_free_mib * MIB)
    return (slots + 2) * version_bytes + MARGIN
