"""Request bodies, read within a size limit and a deadline, uploads streamed to a file.

An upload is written to a temporary file in bounded chunks as it arrives, so a server with
many uploads in flight holds about one body's worth of memory per upload (the checked
tensors), not the body and its copies. A body that does not arrive within the deadline
answers 408; a client that disconnects raises :class:`ClientDisconnectedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import Request
from starlette.requests import ClientDisconnect

from fedper.protocol import ErrorCode
from server.errors import ClientDisconnectedError, ProtocolError, too_large
from server.update_store import UpdateStore


def _check_length(request: Request, limit: int) -> None:
    """413 before anything is read or written, when the Content-Length says so."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(limit)


async def _receive(request: Request, limit: int, timeout: float, sink: Callable[[bytes], object]) -> None:
    """Hand the body to ``sink`` chunk by chunk: 413 past ``limit`` (chunked bodies too),
    408 past ``timeout``, ClientDisconnectedError if the client goes."""
    total = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise too_large(limit)
                sink(chunk)
    except TimeoutError as exc:
        raise ProtocolError(408, ErrorCode.UPLOAD_TIMEOUT, f"the body did not arrive within {timeout:g} s") from exc
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc


async def read_small(request: Request, limit: int, timeout: float) -> bytes:
    """A small body (JSON) in memory."""
    _check_length(request, limit)
    chunks: list[bytes] = []
    await _receive(request, limit, timeout, chunks.append)
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def streamed_to_file(request: Request, limit: int, timeout: float, store: UpdateStore) -> AsyncIterator[Path]:
    """The body as a temporary file in ``tmp/``, removed when the block ends. Chunks go to the
    page cache as they arrive (microseconds each; no fsync: the body itself is never kept)."""
    _check_length(request, limit)
    with store.temp_file(".body") as (path, f):
        await _receive(request, limit, timeout, f.write)
        f.flush()
        yield path
