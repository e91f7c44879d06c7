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
from fedper.server.errors import ClientDisconnectedError, ProtocolError, too_large
from fedper.server.update_store import UpdateStore
from fedper.server.upload_places import Place


def _check_length(request: Request, limit: int) -> None:
    """413 before anything is read or written, when the Content-Length says so."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(limit)


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
    request: Request, limit: int, pace: BodyPace, sink: Callable[[bytes], object], place: Place | None = None
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
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise too_large(limit)
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
        raise ProtocolError(408, ErrorCode.UPLOAD_TIMEOUT, message) from exc
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc


async def read_small(request: Request, limit: int, pace: BodyPace | float) -> bytes:
    """A body in memory (JSON, a secure round's message), within ``pace`` (or that many seconds)."""
    _check_length(request, limit)
    chunks: list[bytes] = []
    await _receive(request, limit, pace if isinstance(pace, BodyPace) else BodyPace(pace), chunks.append)
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def streamed_to_file(
    request: Request, limit: int, pace: BodyPace, store: UpdateStore, place: Place | None = None
) -> AsyncIterator[Path]:
    """The body as a temporary file in ``tmp/``, removed when the block ends. Chunks go to the
    page cache as they arrive (microseconds each; no fsync: the body itself is never kept)."""
    _check_length(request, limit)
    with store.temp_file(".body") as (path, f):
        await _receive(request, limit, pace, f.write, place)
        f.flush()
        yield path
