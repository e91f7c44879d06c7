"""The ``rate_events`` table: sliding-window rate limits that hold across processes sharing one
database (:class:`fedper.server.rate_limit.SharedRateLimiter`). Times are wall-clock seconds,
which every process agrees on (to the precision of their clocks' synchronisation)."""

from __future__ import annotations

from fedper.server.storage.transaction import Query, Transaction


class RateEventRecords:
    def __init__(self, query: Query) -> None:
        self._query = query

    def window(self, limiter: str, key: str, since: float) -> tuple[int, float | None]:
        """How many events ``key`` has in ``limiter`` after ``since``, and the oldest's time."""
        rows = self._query(
            "SELECT COUNT(*) AS n, MIN(at) AS first FROM rate_events WHERE limiter = ? AND key = ? AND at > ?",
            (limiter, key, since),
        )
        first = rows[0]["first"]
        return int(rows[0]["n"]), None if first is None else float(first)

    def add(self, tx: Transaction, limiter: str, key: str, at: float) -> None:
        tx._execute("INSERT INTO rate_events (limiter, key, at) VALUES (?, ?, ?)", (limiter, key, at))

    def prune(self, tx: Transaction, before: float) -> int:
        """Forget events older than every window (called on the clock's tick)."""
        return tx._execute("DELETE FROM rate_events WHERE at <= ?", (before,))
