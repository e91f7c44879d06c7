"""What a device calls to take part: enrollment and its task."""

from __future__ import annotations

import logging
from typing import TypeVar

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import Scope

from fedper.common.protocol import (
    Challenge,
    ChallengeRequest,
    Enrolled,
    EnrollmentRequest,
    ErrorCode,
    Header,
    Route,
    Task,
)
from fedper.server.auth import DeviceId, State, limit_key
from fedper.server.refusals import ROOT_TAKES_NO_DEVICES, ForbiddenError, MalformedError
from fedper.server.request_body import json_body, read_small
from fedper.server.routes.responses import ERRORS
from fedper.server.tasks import Wait

JSON_LIMIT = 64 * 1024

log = logging.getLogger("fedper.server")
router = APIRouter()
Asked = TypeVar("Asked", ChallengeRequest, EnrollmentRequest)


def _parsed(body: bytes, model: type[Asked]) -> Asked | None:
    """The body as ``model`` (a 400 when it is not), or None when only its enrollment key is
    missing or not a string: answered as a wrong key."""
    data = json_body(body)
    if not isinstance(data, dict):
        raise MalformedError(ErrorCode.MALFORMED_JSON, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        if all(error["loc"][:1] == ("enrollment_key",) for error in exc.errors()):
            return None
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise MalformedError(ErrorCode.BAD_REQUEST, f"{where}: {first['msg']}"[:300]) from exc


def enrollment_spent(scope: Scope, method: str, path: str, key: str) -> tuple[str, int] | None:
    """A challenge or an enrollment from an address whose minute is spent: answered 429 before
    it is read (:mod:`server.address_limit`), as the routes below would answer it after."""
    if method != "POST" or path not in (Route.DEVICES, Route.CHALLENGE):
        return None
    state = getattr(scope["app"].state, "fedper", None)
    if state is None:
        return None
    if path == Route.CHALLENGE:
        wait = state.enrollment.challenges.blocked_locally(key) if state.attestation is not None else 0
        return ("too many challenges from this address", wait) if wait else None
    wait = state.enrollment.per_address.blocked_locally(key)
    return ("too many enrollments from this address", wait) if wait else None


@router.post(Route.CHALLENGE, status_code=201, response_model=Challenge, responses=ERRORS)
async def challenge(request: Request, state: State) -> Challenge:
    """A single-use nonce for the platform's attestation request (docs/SERVER.md)."""
    body = await read_small(request, JSON_LIMIT, state.config.request_body_timeout)
    return await to_thread.run_sync(state.enrollment.challenge, _parsed(body, ChallengeRequest), limit_key(request))


@router.post(Route.DEVICES, status_code=201, response_model=Enrolled, responses=ERRORS)
async def enroll(request: Request, state: State) -> Enrolled:
    if state.config.regions:
        raise ForbiddenError(ROOT_TAKES_NO_DEVICES)
    if state.rounds.draining is not None:  # before the body is read
        raise state.rounds.busy()
    body = await read_small(request, JSON_LIMIT, state.config.request_body_timeout)
    return await state.enrollment.enroll(_parsed(body, EnrollmentRequest), limit_key(request))


@router.get(Route.TASK, response_model=Task, responses={204: {"description": "no task now"}, **ERRORS})
def task(request: Request, device_id: DeviceId, state: State) -> Response:
    """The open round's task, or 204 with a Retry-After (PROTOCOL.md, "Cohorts": pace steering)."""
    capabilities = {c.strip() for c in request.headers.get(Header.CAPABILITIES, "").split(",")}
    found = state.tasks.task(device_id, capabilities)
    if isinstance(found, Wait):
        return Response(status_code=204, headers={Header.RETRY_AFTER: str(found.retry_after)})
    return JSONResponse(found.model_dump())
