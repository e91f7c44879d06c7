"""A device's private storage: its token, cached artifacts and bases, and its personal head.

Layout::

    device.json                    device id and token (mode 0600)
    pinned_manifest                sha256 of the manifest this device trains
    artifacts/<manifest sha256>/   manifest.json, train.pte, ... (verified by sha256)
    bases/<manifest sha256>/v<N>.safetensors   downloaded model versions of that export (+ .etag)
    heads/<manifest sha256>.safetensors   the personal head: never leaves the device
    heads/<manifest sha256>.staged        a round's trained head, until the server accepts the round

Every write goes to a temporary file that is fsynced and renamed, so a crash at any
moment leaves the previous complete file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from fedper.common import weights
from fedper.common.atomic_write import atomic_write_bytes, atomic_write_text, fsync_directory

_SHA256 = re.compile(r"[0-9a-f]{64}")


class DeviceStorage:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # --- identity ---------------------------------------------------------------------

    def credentials(self) -> tuple[str, str] | None:
        path = self.root / "device.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return str(data["device_id"]), str(data["token"])

    def save_credentials(self, device_id: str, token: str) -> None:
        atomic_write_text(
            self.root / "device.json",
            json.dumps({"device_id": device_id, "token": token}),
            mode=0o600,
        )

    # --- manifest and artifacts --------------------------------------------------------

    def pinned_manifest(self) -> str | None:
        path = self.root / "pinned_manifest"
        return path.read_text().strip() if path.exists() else None

    def pin_manifest(self, sha256: str) -> None:
        atomic_write_text(self.root / "pinned_manifest", sha256 + "\n")

    def artifact_dir(self, manifest_sha: str) -> Path:
        path = self.root / "artifacts" / manifest_sha
        path.mkdir(parents=True, exist_ok=True)
        return path

    # --- bases: per manifest, since model versions restart at 0 in every run ---------------

    def _base_dir(self, manifest_sha: str) -> Path:
        if not _SHA256.fullmatch(manifest_sha):
            raise ValueError(f"not a sha256: {manifest_sha!r}")
        return self.root / "bases" / manifest_sha

    def base_path(self, manifest_sha: str, version: int) -> Path:
        return self._base_dir(manifest_sha) / f"v{version}.safetensors"

    def base_etag(self, manifest_sha: str, version: int) -> str | None:
        path = self._base_dir(manifest_sha) / f"v{version}.etag"
        return path.read_text().strip() if path.exists() and self.base_path(manifest_sha, version).exists() else None

    def save_base(self, manifest_sha: str, version: int, data: bytes, etag: str) -> None:
        directory = self._base_dir(manifest_sha)
        atomic_write_bytes(self.base_path(manifest_sha, version), data)
        atomic_write_text(directory / f"v{version}.etag", etag)
        for old in directory.glob("v*.safetensors"):  # keep the latest two
            v = int(old.stem[1:])
            if v < version - 1:
                old.unlink(missing_ok=True)
                (directory / f"v{v}.etag").unlink(missing_ok=True)

    # --- the personal head -------------------------------------------------------------

    def head_path(self, manifest_sha: str) -> Path:
        return self.root / "heads" / f"{manifest_sha}.safetensors"

    def load_head(self, manifest_sha: str) -> dict[str, np.ndarray] | None:
        path = self.head_path(manifest_sha)
        return weights.load(path) if path.exists() else None

    # A round's trained head is staged and committed only once the server accepted the round's
    # base: a round that runs again (its upload refused or lost) starts from the committed head,
    # so the same photos never train the head twice for one base update.

    def staged_head_path(self, manifest_sha: str) -> Path:
        return self.root / "heads" / f"{manifest_sha}.staged"

    def stage_head(self, manifest_sha: str, tensors: dict[str, Any]) -> None:
        weights.save(self.staged_head_path(manifest_sha), tensors)

    def commit_head(self, manifest_sha: str) -> None:
        """The staged head becomes the head: one rename, so a crash leaves one or the other whole,
        made durable by syncing the directory (until then a power cut can undo the rename)."""
        os.replace(self.staged_head_path(manifest_sha), self.head_path(manifest_sha))
        fsync_directory(self.head_path(manifest_sha).parent)
