"""A device's private storage: its token, cached artifacts and bases, and its personal head.

Layout::

    device.json                    device id and token (mode 0600)
    pinned_manifest                sha256 of the manifest this device trains
    artifacts/<manifest sha256>/   manifest.json, train.pte, ... (verified by sha256)
    bases/v<N>.safetensors         downloaded model versions (+ .etag)
    heads/<manifest sha256>.safetensors   the personal head: never leaves the device

Every write goes to a temporary file that is fsynced and renamed, so a crash at any
moment leaves the previous complete file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedper import weights
from fedper.atomic_write import atomic_write_bytes, atomic_write_text


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

    # --- bases -------------------------------------------------------------------------

    def base_path(self, version: int) -> Path:
        return self.root / "bases" / f"v{version}.safetensors"

    def base_etag(self, version: int) -> str | None:
        path = self.root / "bases" / f"v{version}.etag"
        return path.read_text().strip() if path.exists() else None

    def save_base(self, version: int, data: bytes, etag: str) -> None:
        atomic_write_bytes(self.base_path(version), data)
        atomic_write_text(self.root / "bases" / f"v{version}.etag", etag)
        for old in (self.root / "bases").glob("v*.safetensors"):  # keep the latest two
            v = int(old.stem[1:])
            if v < version - 1:
                old.unlink(missing_ok=True)
                (self.root / "bases" / f"v{v}.etag").unlink(missing_ok=True)

    # --- the personal head -------------------------------------------------------------

    def head_path(self, manifest_sha: str) -> Path:
        return self.root / "heads" / f"{manifest_sha}.safetensors"

    def load_head(self, manifest_sha: str) -> dict[str, np.ndarray] | None:
        path = self.head_path(manifest_sha)
        return weights.load(path) if path.exists() else None

    def save_head(self, manifest_sha: str, tensors: dict[str, Any]) -> None:
        weights.save(self.head_path(manifest_sha), tensors)
