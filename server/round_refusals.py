"""Each round's upload refusals by error code, counted while it is open and recorded with it
when it ends (the operator's per-round refusals: ``/metrics`` and the dashboard)."""

from __future__ import annotations

import threading
from collections import Counter


class RoundRefusals:
    """A refusal counts against the round open when it happened, whatever round its request
    named: a client cannot grow this by naming rounds. Only the open round and the one before
    are kept (a refusal may race the round's end); a restart loses the open round's count.

    Processes that share a database add what they counted to it on each tick (:meth:`unshared`,
    then :meth:`shared`); a round's record adds the rest of the closer's own count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_round: dict[int, Counter[str]] = {}
        self._shared: dict[int, Counter[str]] = {}  # the part of _by_round already in the database

    def add(self, open_round: int, code: str) -> None:
        with self._lock:
            self._by_round.setdefault(open_round, Counter())[code] += 1
            for old in [r for r in self._by_round if r < open_round - 1]:
                del self._by_round[old]
                self._shared.pop(old, None)

    def of(self, number: int) -> dict[str, int]:
        with self._lock:
            return dict(self._by_round.get(number, {}))

    def unshared_of(self, number: int) -> dict[str, int]:
        with self._lock:
            left = self._by_round.get(number, Counter()) - self._shared.get(number, Counter())
            return dict(left)

    def unshared(self) -> tuple[int, dict[str, int]]:
        """The newest round counted and its refusals not yet added to the database."""
        with self._lock:
            if not self._by_round:
                return 0, {}
            newest = max(self._by_round)
            return newest, dict(self._by_round[newest] - self._shared.get(newest, Counter()))

    def shared(self, number: int, counts: dict[str, int]) -> None:
        with self._lock:
            self._shared.setdefault(number, Counter()).update(counts)
