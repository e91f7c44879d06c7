"""Per-address sliding-window limits: enrollments, and failed authentications.

The enrollment key ships inside apps (not a secret), and the admin token must not be
guessable at network speed, so both are limited per client address (the peer's, or the
one a trusted proxy reports). An IPv6 address counts as its /64: one subscriber's
allocation, in which an attacker can pick any of 2^64 addresses. The number of addresses
tracked is bounded, so rotating addresses costs the attacker the limit, not the server its
memory.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict, deque

from fedper.server.refusals import RateLimitedError, RefusalError, UnauthorizedError

MAX_ADDRESSES = 100_000
IPV6_PREFIX = 64


def address_key(host: str) -> str:
    """The key an address is limited under: an IPv4 address itself, an IPv6 address's /64
    (an IPv4-mapped IPv6 address is its IPv4 address); anything else as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/{IPV6_PREFIX}", strict=False))
    return str(address)


def failed_attempt(limiter: RateLimiter, address: str, message: str) -> RefusalError:
    """A failed authentication from ``address``: 401, counted against it; 429 once it is over the limit."""
    wait = limiter.blocked(address)
    if wait:
        return RateLimitedError("too many failed authentications from this address", wait)
    limiter.record(address)
    return UnauthorizedError(message)


class RateLimiter:
    """At most ``limit`` events per ``window`` seconds per key."""

    def __init__(self, limit: int, window: float = 60.0, max_keys: int = MAX_ADDRESSES):
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._events: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        events = self._events.get(key)
        if events is None:
            events = self._events[key] = deque()
            while len(self._events) > self.max_keys:
                self._events.popitem(last=False)
        while events and events[0] <= now - self.window:
            events.popleft()
        return events

    def _wait(self, events: deque[float], now: float) -> int:
        return max(1, int(events[0] + self.window - now) + 1)

    def allow(self, key: str, now: float | None = None) -> tuple[bool, int]:
        """Count one event if under the limit: (allowed, seconds to wait if not)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            events = self._recent(key, now)
            if len(events) >= self.limit:
                return False, self._wait(events, now)
            events.append(now)
            return True, 0

    def blocked(self, key: str, now: float | None = None) -> int:
        """Seconds to wait if ``key`` is at the limit, else 0 (counts nothing)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if key not in self._events:
                return 0
            events = self._recent(key, now)
            return self._wait(events, now) if len(events) >= self.limit else 0

    def count(self, key: str, now: float | None = None) -> int:
        """Events of ``key`` in the window (counts nothing)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return len(self._recent(key, now)) if key in self._events else 0

    def record(self, key: str, now: float | None = None) -> None:
        """Count one event, whatever the limit."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._recent(key, now).append(now)
