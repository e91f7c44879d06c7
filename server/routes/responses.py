"""What the routers share: the OpenAPI description of error answers, and file answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request, Response
from fastapi.responses import FileResponse

from fedper.common.protocol import Header
from fedper.server.state import ServerState

OCTETS = Header.OCTET_STREAM

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {
        "description": text,
        "content": {Header.JSON: {"example": {"code": "...", "message": "..."}}},
    }
    for code, text in {
        400: "malformed body", 401: "missing/unknown token", 403: "wrong role", 404: "unknown",
        408: "body too slow", 409: "conflict", 410: "run finished", 413: "too large", 422: "wrong content",
        429: "rate limited", 500: "server fault (internal_error, with a request_id)",
        503: "too many uploads in flight (server_busy)",
    }.items()
}  # fmt: skip


def file_response(path: Path, sha256: str, request: Request, state: ServerState) -> Response:
    etag = f'"{sha256}"'
    if etag in [t.strip() for t in request.headers.get(Header.IF_NONE_MATCH, "").split(",")]:
        return Response(status_code=304, headers={Header.ETAG: etag})
    state.metrics.sent(path.stat().st_size)
    return FileResponse(path, media_type=OCTETS, headers={Header.ETAG: etag})
