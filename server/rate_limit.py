"""Per-address rate limit for enrollment (the enrollment key ships inside apps: not a secret)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque


class RateLimiter:
    """At most ``limit`` events per ``window`` seconds per key (sliding window)."""

    def __init__(self, limit: int, window: float = 60.0):
        self.limit = limit
        self.window = window
        self._events: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> tuple[bool, int]:
        """(allowed, seconds to wait if not)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            events = self._events[key]
            while events and events[0] <= now - self.window:
                events.popleft()
            if len(events) >= self.limit:
                return False, max(1, int(events[0] + self.window - now) + 1)
            events.append(now)
            return True, 0
