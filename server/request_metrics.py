"""Request latency for the operator (``GET /metrics``): an ASGI middleware that times every HTTP
request from its first byte in to its last byte out, labelled by the route it matched (the
route's template, so the label set is bounded: unmatched paths are ``other``), its method and the
class of its answer (``2xx`` ... ``5xx``)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# From a cached download (~1 ms) to an upload of a full-width base over a slow link (~minutes).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def request_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("fedper_request_duration_seconds", "HTTP requests, from the first byte in to the last out",
                     ["route", "method", "answer"], buckets=BUCKETS, registry=registry)  # fmt: skip


class RequestTimer:
    """Observes each request's duration into the server's histogram (its state's, once the
    lifespan opened it); a request whose answer never started (the client went away) counts as
    ``4xx``, one the app failed with as ``5xx``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [499]

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            status[0] = 500
            raise
        finally:
            state = getattr(scope["app"].state, "fedper", None)
            if state is not None:
                template = getattr(scope.get("route"), "path", None) or "other"
                answer = f"{min(max(status[0] // 100, 1), 5)}xx"
                state.metrics.requests.labels(template, scope["method"], answer).observe(time.perf_counter() - start)
