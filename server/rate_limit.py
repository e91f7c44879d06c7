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
from collections.abc import Callable
from typing import Protocol

from fedper.server.refusals import RateLimitedError, RefusalError, UnauthorizedError
from fedper.server.storage import Database

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


def failed_attempt(limiter: Limiter, address: str, message: str) -> RefusalError:
    """A failed authentication from ``address``: 401, counted against it; 429 once it is over the limit."""
    wait = limiter.blocked(address)
    if wait:
        return RateLimitedError("too many failed authentications from this address", wait)
    limiter.record(address)
    return UnauthorizedError(message)


WINDOW = 60.0  # seconds: the window of every rate limit (the database forgets older events)


class RateLimiter:
    """At most ``limit`` events per ``window`` seconds per key."""

    def __init__(self, limit: int, window: float = WINDOW, max_keys: int = MAX_ADDRESSES):
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

    def blocked_locally(self, key: str) -> int:
        """The same as :meth:`blocked`: this process holds every event."""
        return self.blocked(key)

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


class Limiter(Protocol):
    """A sliding-window limit: :class:`RateLimiter` (one process's memory) or
    :class:`SharedRateLimiter` (the database: every process sharing it counts the same events)."""

    limit: int

    def allow(self, key: str, now: float | None = None) -> tuple[bool, int]: ...
    def blocked(self, key: str, now: float | None = None) -> int: ...
    def blocked_locally(self, key: str) -> int: ...
    def count(self, key: str, now: float | None = None) -> int: ...
    def record(self, key: str, now: float | None = None) -> None: ...


class SharedRateLimiter:
    """At most ``limit`` events per :data:`WINDOW` seconds per key, counted in the database, so that
    replicas behind a load balancer share one limit (an address does not get one per replica).
    Wall-clock time, which the processes agree on. Each method reads or writes the database:
    call it from a worker thread, never from the event loop, except :meth:`blocked_locally`."""

    def __init__(self, db: Database, name: str, limit: int, clock: Callable[[], float] = time.time) -> None:
        self.db, self.name, self.limit, self._clock = db, name, limit, clock
        self._seen_blocked: OrderedDict[str, float] = OrderedDict()  # key -> until when, as this process saw it
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> tuple[bool, int]:
        now = self._clock() if now is None else now
        with self.db.transaction() as tx:
            wait = self._wait(key, now)
            if wait:
                return False, wait
            self.db.rate_events.add(tx, self.name, key, now)
            return True, 0

    def blocked(self, key: str, now: float | None = None) -> int:
        return self._wait(key, self._clock() if now is None else now)

    def blocked_locally(self, key: str) -> int:
        """Seconds to wait if this process last found ``key`` at the limit (no database read)."""
        now = self._clock()
        with self._lock:
            until = self._seen_blocked.get(key)
            if until is None or until <= now:
                self._seen_blocked.pop(key, None)
                return 0
            return max(1, int(until - now) + 1)

    def count(self, key: str, now: float | None = None) -> int:
        now = self._clock() if now is None else now
        return self.db.rate_events.window(self.name, key, now - WINDOW)[0]

    def record(self, key: str, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        with self.db.transaction() as tx:
            self.db.rate_events.add(tx, self.name, key, now)

    def _wait(self, key: str, now: float) -> int:
        """Seconds to wait if ``key`` is at the limit (remembered for :meth:`blocked_locally`), else 0."""
        count, first = self.db.rate_events.window(self.name, key, now - WINDOW)
        if count < self.limit or first is None:
            return 0
        until = first + WINDOW
        with self._lock:
            self._seen_blocked[key] = until
            self._seen_blocked.move_to_end(key)
            while len(self._seen_blocked) > MAX_ADDRESSES:
                self._seen_blocked.popitem(last=False)
        return max(1, int(until - now) + 1)
