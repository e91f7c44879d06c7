"""Protocol errors: every 4xx/5xx answer carries a stable ``code`` and a ``message``."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


class ProtocolError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def unauthorized(message: str = "missing or unknown token") -> ProtocolError:
    return ProtocolError(401, "unauthorized", message)


def forbidden(message: str) -> ProtocolError:
    return ProtocolError(403, "forbidden", message)


def not_found(what: str) -> ProtocolError:
    return ProtocolError(404, "not_found", f"{what} does not exist")


def bad_request(code: str, message: str) -> ProtocolError:
    return ProtocolError(400, code, message)


def unprocessable(code: str, message: str) -> ProtocolError:
    return ProtocolError(422, code, message)


def conflict(code: str, message: str) -> ProtocolError:
    return ProtocolError(409, code, message)


def too_large(limit: int) -> ProtocolError:
    return ProtocolError(413, "payload_too_large", f"the body is larger than {limit} bytes")


async def protocol_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProtocolError)
    return JSONResponse({"code": exc.code, "message": exc.message}, status_code=exc.status, headers=exc.headers)
