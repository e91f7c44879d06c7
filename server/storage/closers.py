"""The ``closers`` table: which process closes a round (a lease with a fencing token).

Several ``fedper serve`` processes may share one PostgreSQL database (docs/SCALING.md). Sealing a
round (taking its row) ends its admissions: no update or secure message is recorded into a
sealed round, so the closer aggregates a set that cannot grow under it. The lease runs until
``until``; a closer that dies or stalls past it is replaced by the next process whose clock finds
the round due, with the token one higher. The closing transaction checks that it still holds its
token (:meth:`CloserRecords.holds`), so a replaced closer that wakes up publishes nothing. Every
write transaction holds the database's write lock, so a check inside one cannot be overtaken.
"""

from __future__ import annotations

from fedper.server.storage.transaction import Query, Transaction


class CloserRecords:
    def __init__(self, query: Query) -> None:
        self._query = query

    def seal(self, tx: Transaction, number: int, holder: str, now: float, lease: float) -> int | None:
        """Seal round ``number`` for ``holder`` until ``now + lease``: its fencing token, or None
        while another holder's lease runs."""
        rows = self._query("SELECT token, until FROM closers WHERE round = ?", (number,))
        if rows and float(rows[0]["until"]) > now:
            return None
        token = int(rows[0]["token"]) + 1 if rows else 1
        tx._execute(
            "INSERT INTO closers (round, token, holder, until) VALUES (?, ?, ?, ?) ON CONFLICT (round)"
            " DO UPDATE SET token = excluded.token, holder = excluded.holder, until = excluded.until",
            (number, token, holder, now + lease),
        )
        return token

    def renew(self, tx: Transaction, number: int, token: int, until: float) -> bool:
        """Extend the lease; False if ``token`` no longer holds it."""
        return tx._execute("UPDATE closers SET until = ? WHERE round = ? AND token = ?", (until, number, token)) == 1

    def holds(self, number: int, token: int) -> bool:
        return bool(self._query("SELECT 1 FROM closers WHERE round = ? AND token = ?", (number, token)))

    def holder(self, number: int) -> str | None:
        """Who holds round ``number``'s seal (``host:pid:random``), for the operator."""
        rows = self._query("SELECT holder FROM closers WHERE round = ?", (number,))
        return str(rows[0]["holder"]) if rows else None

    def sealed(self, number: int) -> bool:
        """Whether round ``number`` is sealed (its closer may have died: it stays sealed for the next),
        or at a regional server its sum is made (it stays sealed until the root's round ends)."""
        return bool(self._query("SELECT 1 FROM closers WHERE round = ? UNION ALL SELECT 1 FROM forwards"
                                " WHERE round = ?", (number, number)))  # fmt: skip

    def lease_live(self, number: int, now: float) -> bool:
        return bool(self._query("SELECT 1 FROM closers WHERE round = ? AND until > ?", (number, now)))

    def release(self, tx: Transaction, number: int, token: int) -> None:
        """Unseal: the round takes updates again (its close was deferred or met a full disk)."""
        tx._execute("DELETE FROM closers WHERE round = ? AND token = ?", (number, token))

    def forget(self, tx: Transaction, number: int) -> None:
        """In the transaction that ends round ``number``."""
        tx._execute("DELETE FROM closers WHERE round = ?", (number,))

    def release_all(self, tx: Transaction) -> None:
        """At the start of the only process (SQLite): every seal is a dead closer's."""
        tx._execute("DELETE FROM closers")
