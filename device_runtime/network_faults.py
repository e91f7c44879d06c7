"""httpx transports for testing devices: one that fails requests at random, one that records."""

from __future__ import annotations

import random
import threading

import httpx


class FlakyTransport(httpx.BaseTransport):
    """Fails a request with a connection error with probability ``p`` (before sending it)."""

    def __init__(self, p: float, seed: int, inner: httpx.BaseTransport | None = None):
        self.p = p
        self._rng = random.Random(seed)
        self._inner = inner or httpx.HTTPTransport()
        self.failures = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._rng.random() < self.p:
            self.failures += 1
            raise httpx.ConnectError("simulated network failure", request=request)
        return self._inner.handle_request(request)


class RecordingTransport(httpx.BaseTransport):
    """Keeps (method, path, body) of every request that went out."""

    def __init__(self, inner: httpx.BaseTransport | None = None):
        self._inner = inner or httpx.HTTPTransport()
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        with self._lock:
            self.requests.append((request.method, request.url.path, body))
        return self._inner.handle_request(request)
