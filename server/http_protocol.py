"""uvicorn's h11 protocol with a deadline for request headers, and JSON for malformed HTTP.

uvicorn limits idle keep-alive connections but not a client that connects and never
finishes its headers (slowloris): each such connection holds a file descriptor for as long
as the client likes. Here every request's headers must be complete within
``header_timeout`` seconds of the connection opening or of the previous response; then the
connection is answered 408 and closed. (Slow bodies are the application's business: it
reads them under ``--upload-timeout``.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from fedper.common.protocol import ErrorCode


def _raw_response(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"code": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    header_timeout = 10.0  # set by :func:`protocol_class`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_request() or self.transport.is_closing():
            return
        self.transport.write(
            _raw_response(408, "Request Timeout", ErrorCode.HEADER_TIMEOUT,
                          f"the request headers did not arrive within {self.header_timeout:g} s")
        )  # fmt: skip
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_raw_response(400, "Bad Request", ErrorCode.BAD_REQUEST, msg))
        self.transport.close()


def protocol_class(header_timeout: float) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout": header_timeout})
