"""A recording HTTP proxy for the tests: devices talk to it over a socket, it forwards every
request to the real server over another and keeps what passed (what a network observer, or the
server itself, receives)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# Hop-by-hop headers (RFC 9110 7.6.1) and what the proxy sets itself (the body is re-sent whole).
_NOT_FORWARDED = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
                  "content-length", "content-encoding", "host"}  # fmt: skip


@dataclass(frozen=True)
class Exchange:
    """One request as it went to the server, and the status that came back."""

    method: str
    path: str
    body: bytes
    status: int


Hook = Callable[[Exchange], None]


class RecordingProxy:
    """Forwards to ``upstream``; ``after`` runs on each exchange before its answer goes back to the
    device (so the device cannot go on until it returns)."""

    def __init__(self, upstream: str, after: Hook | None = None):
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._upstream = httpx.Client(base_url=upstream, timeout=120)
        self._after = after
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
                answer = proxy._upstream.request(self.command, self.path, headers=headers, content=body)
                exchange = Exchange(self.command, httpx.URL(self.path).path, body, answer.status_code)
                with proxy._lock:
                    proxy.exchanges.append(exchange)
                if proxy._after is not None:
                    proxy._after(exchange)
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in _NOT_FORWARDED:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 (the names http.server calls)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def requests(self, method: str, contains: str) -> list[Exchange]:
        """The recorded requests of ``method`` whose path contains ``contains``."""
        with self._lock:
            return [e for e in self.exchanges if e.method == method and contains in e.path]

    @contextmanager
    def running(self) -> Iterator[RecordingProxy]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            self._upstream.close()
