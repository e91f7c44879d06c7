"""Counters for ``GET /metrics`` (Prometheus text format)."""

from __future__ import annotations

import threading
from collections import Counter


class MetricsRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0

    def reject(self, code: str) -> None:
        with self._lock:
            self.rejected[code] += 1

    def accept(self, nbytes: int) -> None:
        with self._lock:
            self.accepted += 1
            self.bytes_in += nbytes

    def sent(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_out += nbytes

    def render(self, rounds_closed: int, current_round: int, aggregation_seconds: float, in_flight: int) -> str:
        with self._lock:
            lines = [
                "# TYPE fedper_rounds_closed_total counter",
                f"fedper_rounds_closed_total {rounds_closed}",
                "# TYPE fedper_current_round gauge",
                f"fedper_current_round {current_round}",
                "# TYPE fedper_updates_accepted_total counter",
                f"fedper_updates_accepted_total {self.accepted}",
                "# TYPE fedper_updates_rejected_total counter",
            ]
            lines += [f'fedper_updates_rejected_total{{code="{c}"}} {n}' for c, n in sorted(self.rejected.items())]
            lines += [
                "# TYPE fedper_bytes_received_total counter",
                f"fedper_bytes_received_total {self.bytes_in}",
                "# TYPE fedper_bytes_sent_total counter",
                f"fedper_bytes_sent_total {self.bytes_out}",
                "# TYPE fedper_aggregation_seconds_total counter",
                f"fedper_aggregation_seconds_total {aggregation_seconds:.6f}",
                "# TYPE fedper_uploads_in_flight gauge",
                f"fedper_uploads_in_flight {in_flight}",
            ]
        return "\n".join(lines) + "\n"
