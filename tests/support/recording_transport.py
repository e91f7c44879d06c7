"""An httpx transport for device tests that keeps every request a device sent."""

from __future__ import annotations

import threading
import time

import httpx


class RecordingTransport(httpx.BaseTransport):
    """Keeps (method, path, body) of every request that went out, and a trace line per request
    (when, what, the status or the error that came back) for a failing test to print."""

    def __init__(self, inner: httpx.BaseTransport | None = None):
        self._inner = inner or httpx.HTTPTransport()
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self.requests: list[tuple[str, str, bytes]] = []
        self.trace: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        with self._lock:
            self.requests.append((request.method, request.url.path, body))
        sent = time.monotonic() - self._start
        try:
            response = self._inner.handle_request(request)
        except Exception as e:
            self._note(sent, request, f"{type(e).__name__}: {e}")
            raise
        self._note(sent, request, str(response.status_code))
        return response

    def _note(self, sent: float, request: httpx.Request, outcome: str) -> None:
        took = time.monotonic() - self._start - sent
        with self._lock:
            self.trace.append(f"{sent:7.2f} s +{took:5.2f} {request.method} {request.url.path} -> {outcome}")
