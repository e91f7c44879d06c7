"""Each round's upload refusals by error code, counted while it is open and recorded with it
when it ends (the operator's per-round refusals: ``/metrics`` and the dashboard)."""

from __future__ import annotations

import threading
from collections import Counter


class RoundRefusals:
    """A refusal counts against the round open when it happened, whatever round its request
    named: a client cannot grow this by naming rounds. Only the open round and the one before
    are kept (a refusal may race the round's end); a restart loses the open round's count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_round: dict[int, Counter[str]] = {}

    def add(self, open_round: int, code: str) -> None:
        with self._lock:
            self._by_round.setdefault(open_round, Counter())[code] += 1
            for old in [r for r in self._by_round if r < open_round - 1]:
                del self._by_round[old]

    def of(self, number: int) -> dict[str, int]:
        with self._lock:
            return dict(self._by_round.get(number, {}))
