"""The repository's tracked files, and a copy of them to build or install from (as a clean clone)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tracked(pattern: str = "*") -> list[Path]:
    """Files git tracks (links as links), staged ones included."""
    out = subprocess.run(["git", "ls-files", "-z", pattern], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def copy_tracked(destination: Path) -> Path:
    """The tracked files, links kept as links: what a clean clone holds, without .venv or build output."""
    for path in tracked():
        target = destination / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        elif path.is_file():
            shutil.copy2(path, target)
    return destination
