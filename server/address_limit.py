"""Requests in progress per client address: what one address holds open, the server's file
descriptors and memory cannot run out for the others.

Issue 50: some 21,000 slow enrollment bodies (a byte every 3 s) from a few addresses reached the
server's 20,000 file descriptors, and no honest request was answered for 20 s. Each request's
body now has a deadline (``--request-body-timeout``), and one address (an IPv6 /64) may have at
most ``--max-requests-per-address`` requests in progress: the next gets ``429 rate_limited``
before anything of it is read. A carrier NAT puts many phones behind one address; the limit is
of requests in progress at once, which phones that each ask and upload in turn stay far below.
"""

from __future__ import annotations

import json
from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send

from fedper.common.protocol import ErrorCode, Header
from fedper.server.rate_limit import address_key


class PerAddressLimit:
    """ASGI middleware: at most ``limit`` HTTP requests in progress per address (0: no limit)."""

    def __init__(self, app: ASGIApp, limit: int, retry_after: int) -> None:
        self.app, self.limit, self.retry_after = app, limit, retry_after
        self._open: Counter[str] = Counter()  # only touched on the event loop: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limit:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        key = address_key(client[0] if client else "unknown")
        if self._open[key] >= self.limit:
            await _refuse(send, self.limit, self.retry_after)
            return
        self._open[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


async def _refuse(send: Send, limit: int, retry_after: int) -> None:
    message = f"this address has {limit} requests in progress, as many as the server takes from one; retry later"
    body = json.dumps({"code": ErrorCode.RATE_LIMITED, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (Header.RETRY_AFTER.lower().encode(), str(retry_after).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
