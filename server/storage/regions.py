"""A tree of servers (docs/SCALING.md, "Hierarchical aggregation"): at the root, the regions'
sums of each open round (``region_sums``); at a region, the rounds whose sum went to the root
(``forwards``). Both go when their round ends (:meth:`RoundRecords.end`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedper.server.storage.transaction import SQLITE_MAX, Query, Transaction


@dataclass(frozen=True)
class StoredRegionSum:
    """A region's sum in the root's round: its file (relative to the updates folder) and what its
    metadata says."""

    round: int
    region: int
    file: str
    sha256: str
    weight: int
    count: int


class RegionRecords:
    def __init__(self, query: Query) -> None:
        self._query = query

    # --- at the root ----------------------------------------------------------------------

    def put_sum(self, tx: Transaction, row: StoredRegionSum, now: float) -> None:
        tx._execute(
            "INSERT INTO region_sums (round, region, file, sha256, weight, count, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.round, row.region, row.file, row.sha256, row.weight, row.count, now),
        )

    def sums(self, number: int) -> list[StoredRegionSum]:
        """Round ``number``'s sums, in ascending region (the order the root adds them in)."""
        rows = self._query("SELECT * FROM region_sums WHERE round = ? ORDER BY region", (min(number, SQLITE_MAX),))
        return [StoredRegionSum(int(r["round"]), int(r["region"]), str(r["file"]), str(r["sha256"]),
                                int(r["weight"]), int(r["count"])) for r in rows]  # fmt: skip

    def get(self, number: int, region: int) -> StoredRegionSum | None:
        found = [s for s in self.sums(number) if s.region == region]
        return found[0] if found else None

    def count(self, number: int) -> int:
        rows = self._query("SELECT COUNT(*) AS n FROM region_sums WHERE round = ?", (min(number, SQLITE_MAX),))
        return int(rows[0]["n"])

    # --- at a region ----------------------------------------------------------------------

    def put_forward(self, tx: Transaction, number: int, sha256: str, now: float) -> None:
        """Round ``number``'s sum (``sha256`` of its bytes) is made and on its way to the root: the
        round takes nothing more (:meth:`CloserRecords.sealed`), whatever happens to its closer."""
        tx._execute(
            "INSERT INTO forwards (round, sha256, at, acked) VALUES (?, ?, ?, 0) ON CONFLICT (round) DO NOTHING",
            (number, sha256, now),
        )

    def acknowledged(self, tx: Transaction, number: int) -> None:
        """The root has round ``number``'s sum."""
        tx._execute("UPDATE forwards SET acked = 1 WHERE round = ?", (number,))

    def forwarded(self, number: int) -> tuple[str, bool] | None:
        """The sha256 of round ``number``'s sum and whether the root has it (None: no sum made)."""
        rows = self._query("SELECT sha256, acked FROM forwards WHERE round = ?", (min(number, SQLITE_MAX),))
        return (str(rows[0]["sha256"]), bool(rows[0]["acked"])) if rows else None
