"""The ``devices`` table: enrolled devices, by the hash of their token."""

from __future__ import annotations

import threading
import time

from fedper.server.storage.records import Device
from fedper.server.storage.transaction import Begin, Query


class DeviceRecords:
    """Enrolled devices. Each write is its own transaction (an enrollment stands alone); the count
    is kept in memory."""

    def __init__(self, query: Query, begin: Begin) -> None:
        self._query = query
        self._begin = begin
        self._lock = threading.Lock()  # guards the count
        self._count = int(query("SELECT COUNT(*) AS n FROM devices")[0]["n"])

    def add(self, device_id: str, token_hash: str, platform: str | None) -> None:
        with self._begin() as tx:
            tx._execute(
                "INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                (device_id, token_hash, platform, time.time()),
            )
        with self._lock:
            self._count += 1

    def add_many(self, devices: list[tuple[str, str]], platform: str | None) -> None:
        """Many (id, token hash) at once, in one transaction (the operator's bulk enrollment)."""
        now = time.time()
        with self._begin() as tx:
            tx._executemany("INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                             [(d, h, platform, now) for d, h in devices])  # fmt: skip
        with self._lock:
            self._count += len(devices)

    def by_token_hash(self, token_hash: str) -> Device | None:
        rows = self._query("SELECT id, token_hash, revoked FROM devices WHERE token_hash = ?", (token_hash,))
        return Device(str(rows[0]["id"]), str(rows[0]["token_hash"]), bool(rows[0]["revoked"])) if rows else None

    def revoke(self, device_id: str) -> bool:
        with self._begin() as tx:
            return tx._execute("UPDATE devices SET revoked = 1 WHERE id = ?", (device_id,)) > 0

    def count(self) -> int:
        """Enrolled devices, counted in memory (a COUNT(*) over a million rows on every anonymous
        /v1/status would be a denial of service)."""
        return self._count

    def revoked(self, device_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM devices WHERE id = ? AND revoked = 1", (device_id,)))
