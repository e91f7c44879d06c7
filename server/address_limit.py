"""Requests in progress per client address: what one address holds open, the server's file
descriptors and memory cannot run out for the others.

Some 21,000 slow enrollment bodies (a byte every 3 s) from a few addresses filled a server's
20,000 file descriptors in a measurement, and no honest request was answered for 20 s. So each
request's body has a deadline (``--request-body-timeout``), and one address (an IPv6 /64) may
have at most ``--max-requests-per-address`` requests in progress: the next gets ``429 rate_limited``
before anything of it is read. A carrier NAT puts many phones behind one address; the limit is
of requests in progress at once, which phones that each ask and upload in turn stay far below.

An enrollment flood is mostly requests its address may no longer make (its challenges or
enrollments for the minute are spent): ``refused_early`` answers those ``429`` here, before the
router, the body or the JSON (0.5 ms of the server's CPU each through the route,
bench/enrollment_flood.py), so the flood costs the honest devices' requests less.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from fedper.common.protocol import ErrorCode, Header
from fedper.server.rate_limit import address_key

# (method, path, address key) -> (why, seconds to wait) when the request is refused unread, else None
RefusedEarly = Callable[[Scope, str, str, str], tuple[str, int] | None]


class PerAddressLimit:
    """ASGI middleware: at most ``limit`` HTTP requests in progress per address (0: no limit),
    and the requests ``refused_early`` names answered 429 before anything of them is read."""

    def __init__(self, app: ASGIApp, limit: int, retry_after: int, refused_early: RefusedEarly | None = None) -> None:
        self.app, self.limit, self.retry_after, self.refused_early = app, limit, retry_after, refused_early
        self._open: Counter[str] = Counter()  # only touched on the event loop: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        key = address_key(client[0] if client else "unknown")
        early = self.refused_early(scope, scope["method"], scope["path"], key) if self.refused_early else None
        if early is not None:
            await _refuse(send, early[0], early[1])
            return
        if not self.limit:
            await self.app(scope, receive, send)
            return
        if self._open[key] >= self.limit:
            message = f"this address has {self.limit} requests in progress, as many as the server takes from one"
            await _refuse(send, message + "; retry later", self.retry_after)
            return
        self._open[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


async def _refuse(send: Send, message: str, retry_after: int) -> None:
    body = json.dumps({"code": ErrorCode.RATE_LIMITED, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (Header.RETRY_AFTER.lower().encode(), str(retry_after).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
