"""An httpx transport for device tests that keeps every request a device sent."""

from __future__ import annotations

import threading

import httpx


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
