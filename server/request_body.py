"""Request bodies, read within a size limit, a deadline and a minimum rate, uploads streamed
to a file.

An upload is written to a temporary file in bounded chunks as it arrives, so a server with
many uploads in flight holds about one body's worth of memory per upload (the checked
tensors), not the body and its copies. A body that does not arrive within the deadline, or
that falls behind the minimum rate once its grace period is over (a client trickling a byte
now and then to hold a place among the uploads in flight), answers 408; a client that
disconnects raises :class:`ClientDisconnectedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from starlette.requests import ClientDisconnect

from fedper.common.protocol import ErrorCode
from fedper.server import strict_json
from fedper.server.errors import ClientDisconnectedError
from fedper.server.refusals import BodyTimeoutError, BodyTooLargeError, MalformedError
from fedper.server.update_store import UpdateStore
from fedper.server.upload_places import Place


def json_body(raw: bytes) -> object:
    """A JSON body as the protocol reads JSON (:mod:`server.strict_json`), or a 400."""
    try:
        return strict_json.loads(raw)
    except strict_json.JsonError as exc:
        raise MalformedError(ErrorCode.MALFORMED_JSON, f"the body is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class Body:
    """A request body as it arrives: its chunks, and the length its header announced (if any)."""

    chunks: AsyncIterator[bytes]
    length: int | None


def body_of(request: Request) -> Body:
    length = request.headers.get("content-length")
    return Body(request.stream(), int(length) if length is not None and length.isdigit() else None)


def _check_length(body: Body, limit: int) -> None:
    """413 before anything is read or written, when the Content-Length says so."""
    if body.length is not None and body.length > limit:
        raise BodyTooLargeError(limit)


@dataclass(frozen=True)
class BodyPace:
    """How fast a body must arrive: all of it within ``timeout`` seconds and, after the first
    ``grace`` seconds, at least ``min_rate`` bytes per second on average (0: no minimum)."""

    timeout: float
    min_rate: float = 0.0
    grace: float = 10.0

    def due(self, received: int) -> float:
        """Seconds after the start by which byte ``received + 1`` must have arrived."""
        if not self.min_rate:
            return self.timeout
        return min(self.timeout, self.grace + (received + 1) / self.min_rate)


async def _receive(
    body: Body, limit: int, pace: BodyPace, sink: Callable[[bytes], object], place: Place | None = None
) -> None:
    """Hand the body to ``sink`` chunk by chunk: 413 past ``limit`` (chunked bodies too),
    408 past the deadline or behind the minimum rate, or when its ``place`` is cut for being slow
    while others wait (server.upload_places); ClientDisconnectedError if the client goes."""
    loop = asyncio.get_running_loop()
    start, total = loop.time(), 0
    try:
        async with asyncio.timeout_at(start + pace.due(0)) as deadline:
            if place is not None:
                place.deadline = deadline
            async for chunk in body.chunks:
                total += len(chunk)
                if total > limit:
                    raise BodyTooLargeError(limit)
                sink(chunk)
                if place is not None:
                    place.received = total
                deadline.reschedule(start + pace.due(total))
    except TimeoutError as exc:
        elapsed = loop.time() - start
        if place is not None and place.cut:
            message = (f"the body arrived at {total / max(elapsed, 1e-9):.0f} bytes/s while other devices waited for a "
                       "place: cut; this device may upload again in the next round")  # fmt: skip
        elif elapsed < pace.timeout:
            message = (f"the body arrived at {total / elapsed:.0f} bytes/s, slower than the server's minimum of "
                       f"{pace.min_rate:g} bytes/s (after {pace.grace:g} s)")  # fmt: skip
        else:
            message = f"the body did not arrive within {pace.timeout:g} s"
        raise BodyTimeoutError(message) from exc
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc


async def read_small(request: Request, limit: int, pace: BodyPace | float) -> bytes:
    """A body in memory (JSON, a secure round's message), within ``pace`` (or that many seconds)."""
    body = body_of(request)
    _check_length(body, limit)
    chunks: list[bytes] = []
    await _receive(body, limit, pace if isinstance(pace, BodyPace) else BodyPace(pace), chunks.append)
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def streamed_to_file(
    body: Body, limit: int, pace: BodyPace, store: UpdateStore, place: Place | None = None
) -> AsyncIterator[Path]:
    """The body as a temporary file in ``tmp/``, removed when the block ends. Chunks go to the
    page cache as they arrive (microseconds each; no fsync: the body itself is never kept)."""
    _check_length(body, limit)
    with store.temp_file(".body") as (path, f):
        await _receive(body, limit, pace, f.write, place)
        f.flush()
        yield path
