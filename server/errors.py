"""Protocol errors: every 4xx/5xx answer is JSON with a stable ``code`` and a ``message``.

Faults of the server itself answer 500 ``internal_error`` with a ``request_id`` that the log
line carrying the traceback also holds; a client that went away mid-request costs one INFO
line, not a traceback.
"""

from __future__ import annotations

import json
import logging
import secrets

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fedper.common.protocol import Error, ErrorCode, Header
from fedper.server.refusals import (
    AlreadyReportedError,
    AttestationFailedError,
    BodyTimeoutError,
    BodyTooLargeError,
    CodedRefusalError,
    DeviceRevokedError,
    ForbiddenError,
    MalformedError,
    NotFoundError,
    NotInCohortError,
    PrivacyBudgetSpentError,
    RateLimitedError,
    RefusalError,
    RoundNotOpenError,
    RunFinishedError,
    SecAggUnsupportedError,
    SecureMessageError,
    SecureRoundError,
    SecureStageError,
    SecureStageNotOpenError,
    ServerBusyError,
    StaleBaseError,
    UnacceptableError,
    UnauthorizedError,
    UnknownVersionError,
    UploadInProgressError,
)

log = logging.getLogger("fedper.server")


class ProtocolError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class ClientDisconnectedError(Exception):
    """The client disconnected before its request body arrived: nobody to answer."""


# Every domain refusal (server/refusals.py) as the protocol answers it; None: the refusal's own code.
REFUSALS: dict[type[RefusalError], tuple[int, ErrorCode | None]] = {
    MalformedError: (400, None),
    UnauthorizedError: (401, ErrorCode.UNAUTHORIZED),
    DeviceRevokedError: (401, ErrorCode.UNAUTHORIZED),
    ForbiddenError: (403, ErrorCode.FORBIDDEN),
    AttestationFailedError: (403, ErrorCode.ATTESTATION_FAILED),
    SecAggUnsupportedError: (403, ErrorCode.SECAGG_UNSUPPORTED),
    NotFoundError: (404, ErrorCode.NOT_FOUND),
    UnknownVersionError: (404, ErrorCode.NOT_FOUND),
    BodyTimeoutError: (408, ErrorCode.UPLOAD_TIMEOUT),
    AlreadyReportedError: (409, ErrorCode.DUPLICATE_UPDATE),
    RoundNotOpenError: (409, ErrorCode.ROUND_NOT_OPEN),
    NotInCohortError: (409, ErrorCode.NOT_IN_COHORT),
    StaleBaseError: (409, ErrorCode.STALE_BASE_VERSION),
    UploadInProgressError: (409, ErrorCode.UPLOAD_IN_PROGRESS),
    SecureStageError: (409, ErrorCode.SECAGG_STAGE_CLOSED),
    SecureStageNotOpenError: (409, ErrorCode.SECAGG_STAGE_NOT_OPEN),
    SecureRoundError: (409, ErrorCode.SECURE_ROUND),
    PrivacyBudgetSpentError: (409, ErrorCode.PRIVACY_BUDGET_SPENT),
    RunFinishedError: (410, ErrorCode.RUN_FINISHED),
    BodyTooLargeError: (413, ErrorCode.PAYLOAD_TOO_LARGE),
    UnacceptableError: (422, None),
    SecureMessageError: (422, ErrorCode.BAD_SECAGG_MESSAGE),
    RateLimitedError: (429, ErrorCode.RATE_LIMITED),
    ServerBusyError: (503, ErrorCode.SERVER_BUSY),
}


def answer(refusal: RefusalError) -> ProtocolError:
    """The protocol's answer to a refusal: the table's entry for its class or the nearest base."""
    status, code = next(REFUSALS[kind] for kind in type(refusal).__mro__ if kind in REFUSALS)
    if code is None:
        assert isinstance(refusal, CodedRefusalError)
        code = ErrorCode(refusal.code)
    headers = {Header.RETRY_AFTER: str(refusal.retry_after)} if refusal.retry_after is not None else {}
    if refusal.challenge is not None and status == 401:
        headers["WWW-Authenticate"] = refusal.challenge
    return ProtocolError(status, code, refusal.message, headers)


def code_of(refusal: RefusalError) -> str:
    """The protocol's error code for a refusal (what the metrics count it under)."""
    return answer(refusal).code


async def protocol_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProtocolError)
    return JSONResponse({"code": exc.code, "message": exc.message}, status_code=exc.status, headers=exc.headers)


async def refusal_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RefusalError)
    return await protocol_error_handler(request, answer(exc))


async def client_disconnected_handler(request: Request, _exc: Exception) -> JSONResponse:
    client = request.client.host if request.client else "unknown"
    log.info(json.dumps({"event": "client_disconnected", "path": request.url.path, "client": client}))
    return JSONResponse({"code": ErrorCode.BAD_REQUEST, "message": "the client disconnected"}, status_code=400)


class InternalErrorMiddleware:
    """Outermost layer: an unhandled exception becomes 500 ``internal_error`` (JSON, with a
    ``request_id``) and one ERROR log entry with the traceback, instead of a plain-text body."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            request_id = secrets.token_hex(8)
            log.exception(json.dumps({"event": ErrorCode.INTERNAL_ERROR, "request_id": request_id,
                                      "method": scope.get("method"), "path": scope.get("path")}))  # fmt: skip
            if started:  # too late for a status: the connection is cut instead
                return
            message = "the server failed; report the request_id to its operator"
            body = Error(code=ErrorCode.INTERNAL_ERROR, message=message, request_id=request_id)
            response = JSONResponse(body.model_dump(), status_code=500)
            await response(scope, receive, send)
