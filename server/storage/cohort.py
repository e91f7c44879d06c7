"""The cohort's tables: ``slots`` (a device's place in a round), ``checkins`` (who asked to
take part before the draw), and how often each device took part (read from ``updates``)."""

from __future__ import annotations

from fedper.server.storage.records import Slot
from fedper.server.storage.transaction import Query, Transaction

# Slots of a round that are taken at a moment (the two parameters): not expired, or reported.
_REPORTED = "(SELECT 1 FROM updates u WHERE u.round = s.round AND u.device_id = s.device_id)"
_HELD = (
    "SELECT {what} FROM slots s WHERE s.round = ? AND (s.expires_at IS NULL OR s.expires_at > ? OR EXISTS "
    + _REPORTED
    + ")"
)


# A slot given again (its old one expired) replaces the old one.
_PUT_SLOT = (
    "INSERT INTO slots (round, device_id, assigned_at, expires_at) VALUES (?, ?, ?, ?) ON CONFLICT (round, device_id)"
    " DO UPDATE SET assigned_at = excluded.assigned_at, expires_at = excluded.expires_at"
)


class CohortRecords:
    """Slots, check-ins and participation: what the cohort selection decides from."""

    def __init__(self, query: Query) -> None:
        self._query = query

    # --- slots --------------------------------------------------------------------------

    def slot(self, number: int, device_id: str) -> Slot | None:
        rows = self._query("SELECT * FROM slots WHERE round = ? AND device_id = ?", (number, device_id))
        return Slot(number, device_id, rows[0]["assigned_at"], rows[0]["expires_at"]) if rows else None

    def count_held(self, number: int, now: float) -> int:
        """Slots of round ``number`` that are taken at ``now``: not expired, or already reported."""
        return int(self._query(_HELD.format(what="COUNT(*) AS n"), (number, now))[0]["n"])

    def earliest_expiry(self, number: int, now: float) -> float | None:
        """When the first slot of round ``number`` that is held but not reported will expire."""
        unreported = " AND s.expires_at IS NOT NULL AND NOT EXISTS " + _REPORTED
        rows = self._query(_HELD.format(what="MIN(s.expires_at) AS t") + unreported, (number, now))
        t = rows[0]["t"]
        return None if t is None else float(t)

    def put_slot(self, tx: Transaction, slot: Slot) -> None:
        tx._execute(
            _PUT_SLOT,
            (slot.round, slot.device_id, slot.assigned_at, slot.expires_at),
        )

    def put_slots(self, tx: Transaction, slots: list[Slot]) -> None:
        tx._executemany(
            _PUT_SLOT,
            [(s.round, s.device_id, s.assigned_at, s.expires_at) for s in slots],
        )

    def delete_slot(self, tx: Transaction, number: int, device_id: str) -> None:
        tx._execute("DELETE FROM slots WHERE round = ? AND device_id = ?", (number, device_id))

    # --- check-ins ----------------------------------------------------------------------

    def put_checkin(self, tx: Transaction, number: int, device_id: str, now: float) -> None:
        tx._execute("INSERT INTO checkins (round, device_id, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (number, device_id, now))  # fmt: skip

    def checkins(self, number: int) -> list[str]:
        """The devices that checked in for round ``number``, in the order they came (a read: no
        lock held while a large cohort is drawn)."""
        rows = self._query("SELECT device_id FROM checkins WHERE round = ? ORDER BY at, device_id", (number,))
        return [str(r["device_id"]) for r in rows]

    # --- participation ------------------------------------------------------------------

    def participation_counts(self, first_round: int) -> dict[str, int]:
        """Every device's accepted updates in rounds ``first_round`` and later but those a rollback
        undid (as :meth:`participations`, for all devices in one query)."""
        rows = self._query(
            "SELECT u.device_id AS d, COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.round >= ? AND r.rolled_back = 0 GROUP BY u.device_id",
            (first_round,),
        )
        return {str(r["d"]): int(r["n"]) for r in rows}

    def reporters(self, number: int) -> set[str]:
        """Devices with an accepted update in round ``number``."""
        return {str(r["device_id"]) for r in self._query("SELECT device_id FROM updates WHERE round = ?", (number,))}

    def participations(self, device_id: str, first_round: int) -> int:
        """Accepted updates of ``device_id`` in rounds ``first_round`` and later, but those of rounds a
        rollback undid: their work was thrown away, so it uses up no device's participation."""
        rows = self._query(
            "SELECT COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.device_id = ? AND u.round >= ? AND r.rolled_back = 0",
            (device_id, first_round),
        )
        return int(rows[0]["n"])
