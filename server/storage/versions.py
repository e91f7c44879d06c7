"""The ``model_versions`` table: each published version's file and checksum."""

from __future__ import annotations

from fedper.server.storage.records import ModelVersion
from fedper.server.storage.transaction import SQLITE_MAX, Query, Transaction


class VersionRecords:
    """The published model versions (their weights live in the blob directory)."""

    def __init__(self, query: Query) -> None:
        self._query = query

    def insert(self, tx: Transaction, version: int, sha256: str, file: str, now: float, from_round: int | None) -> None:
        tx._execute(
            "INSERT INTO model_versions (version, sha256, file, created_at, from_round) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (version) DO UPDATE SET sha256 = excluded.sha256, file = excluded.file,"
            " created_at = excluded.created_at, from_round = excluded.from_round",
            (version, sha256, file, now, from_round),
        )

    def get(self, version: int) -> ModelVersion | None:
        if not 0 <= version <= SQLITE_MAX:
            return None
        rows = self._query("SELECT version, sha256, file FROM model_versions WHERE version = ?", (version,))
        return ModelVersion(int(rows[0]["version"]), str(rows[0]["sha256"]), str(rows[0]["file"])) if rows else None

    def parent(self, version: int) -> int | None:
        """The version that the round which produced ``version`` trained (None: the export's
        version 0, an imported one, or its round gone)."""
        rows = self._query("SELECT r.model_version AS v FROM model_versions m JOIN rounds r ON r.round = m.from_round "
                          "WHERE m.version = ?", (version,))  # fmt: skip
        return int(rows[0]["v"]) if rows else None

    def files(self) -> dict[int, str]:
        """Every recorded model version and its file's name, oldest first."""
        return {int(r["version"]): str(r["file"]) for r in self._query("SELECT version, file FROM model_versions "
                                                                      "ORDER BY version")}  # fmt: skip

    def delete(self, tx: Transaction, version: int) -> None:
        tx._execute("DELETE FROM model_versions WHERE version = ?", (version,))

    def latest(self) -> int:
        """The newest recorded version; -1 when there is none."""
        rows = self._query("SELECT MAX(version) AS v FROM model_versions")
        v = rows[0]["v"]
        return -1 if v is None else int(v)
