"""What a device calls to take part: enrollment and its task."""

from __future__ import annotations

import json
import logging
import secrets
from typing import TypeVar

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import Scope

from fedper.common.manifest import MANIFEST_FILE
from fedper.common.protocol import (
    Challenge,
    ChallengeRequest,
    Enrolled,
    EnrollmentRequest,
    ErrorCode,
    Header,
    Route,
    Task,
    TaskConfig,
)
from fedper.server.attestation import NONCE_SECONDS
from fedper.server.auth import DeviceId, State, failed, limit_key
from fedper.server.clock import iso_time
from fedper.server.credentials import new_token, same_secret, token_hash
from fedper.server.refusals import (
    MalformedError,
    NotFoundError,
    RateLimitedError,
    RunFinishedError,
    SecAggUnsupportedError,
)
from fedper.server.request_body import json_body, read_small
from fedper.server.routes.responses import ERRORS

JSON_LIMIT = 64 * 1024
ENROLLMENT_KEY = "enrollment key"  # the one key all enrollments count under

log = logging.getLogger("fedper.server")
router = APIRouter()
Asked = TypeVar("Asked", ChallengeRequest, EnrollmentRequest)


def _parsed(body: bytes, model: type[Asked]) -> Asked | None:
    """The body as ``model`` (a 400 when it is not), or None when only its enrollment key is
    missing or not a string: answered as a wrong key."""
    try:
        return model.model_validate(json_body(body))
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
        wait = state.challenges.blocked(key) if state.attestation is not None else 0
        return ("too many challenges from this address", wait) if wait else None
    wait = state.limiter.blocked(key)
    return ("too many enrollments from this address", wait) if wait else None


@router.post(Route.CHALLENGE, status_code=201, response_model=Challenge, responses=ERRORS)
async def challenge(request: Request, state: State) -> Challenge:
    """A single-use nonce for the platform's attestation request (docs/SERVER.md)."""
    body = await read_small(request, JSON_LIMIT, state.config.request_body_timeout)
    asked = _parsed(body, ChallengeRequest)
    if asked is None or not same_secret(asked.enrollment_key, state.secrets.enrollment_key):
        raise failed(request, state.key_failures, "wrong enrollment key")
    if state.attestation is None:
        raise NotFoundError("attestation on this server (it enrolls without a token)")
    allowed, wait = state.challenges.allow(limit_key(request))
    if not allowed:
        raise RateLimitedError("too many challenges from this address", wait)
    return Challenge(nonce=state.attestation.nonces.issue(), expires_in=NONCE_SECONDS)


@router.post(Route.DEVICES, status_code=201, response_model=Enrolled, responses=ERRORS)
async def enroll(request: Request, state: State) -> Enrolled:
    if state.rounds.draining is not None:
        raise state.rounds.busy()
    body = await read_small(request, JSON_LIMIT, state.config.request_body_timeout)
    enrolling = _parsed(body, EnrollmentRequest)
    if enrolling is None or not same_secret(enrolling.enrollment_key, state.secrets.enrollment_key):
        raise failed(request, state.key_failures, "wrong enrollment key")
    address = limit_key(request)
    first = not state.limiter.count(address)  # the address's first enrollment in the window
    allowed, wait = state.limiter.allow(address)
    if not allowed:
        raise RateLimitedError("too many enrollments from this address", wait)
    allowed, wait = state.enrollments.allow(ENROLLMENT_KEY)
    if not allowed and first:  # a flood from some addresses must not lock out a new one
        allowed, wait = state.first_enrollments.allow(ENROLLMENT_KEY)
    if not allowed:
        raise RateLimitedError("too many enrollments from all addresses together; try again later", wait)
    if state.attestation is not None:
        await state.attestation.verify(enrolling.attestation, enrolling.platform, enrolling.nonce, address, first)
    device_id, token = f"d-{secrets.token_hex(8)}", new_token()
    await to_thread.run_sync(state.db.add_device, device_id, token_hash(token), enrolling.platform)
    log.info(json.dumps({"event": "device_enrolled", "device": device_id, "platform": enrolling.platform}))
    await to_thread.run_sync(state.rounds.enrolled)
    return Enrolled(device_id=device_id, token=token)


def _capabilities(request: Request) -> set[str]:
    return {c.strip() for c in request.headers.get(Header.CAPABILITIES, "").split(",")}


@router.get(Route.TASK, response_model=Task, responses={204: {"description": "no task now"}, **ERRORS})
def task(request: Request, device_id: DeviceId, state: State) -> Response:
    """The open round's task for a device holding (or now given) one of its cohort's slots; 204
    with a Retry-After otherwise (PROTOCOL.md, "Cohorts": pace steering)."""
    rounds = state.rounds
    snap = rounds.snapshot
    if snap.finished:
        raise RunFinishedError()
    if not snap.is_open or rounds.draining is not None:
        return Response(status_code=204, headers={Header.RETRY_AFTER: str(state.config.retry_after)})
    if rounds.secure is not None and Header.SECAGG not in _capabilities(request):
        raise SecAggUnsupportedError(
            "this server aggregates securely (protocol revision 1.7, docs/SECAGG.md) and this device did not say "
            f"it can take part ({Header.CAPABILITIES}: {Header.SECAGG}); it gets no task"
        )
    done = state.db.has_update(snap.round, device_id)
    if rounds.secure is not None and rounds.secure.took_part(snap.round, device_id):
        done = True  # one session per device and round: its keys are the ones it advertised
    slot = None if done else rounds.assign(snap.round, device_id)
    if slot is None:  # reported already, or every slot is held: come back when the round may have moved on
        return Response(status_code=204, headers={Header.RETRY_AFTER: str(rounds.pace())})
    secure = None
    if rounds.secure is not None:
        secure = rounds.secure.task(snap.round)
        if secure is None:  # fewer than two devices were drawn: no secure sum this round
            return Response(status_code=204, headers={Header.RETRY_AFTER: str(rounds.pace())})
    body = Task(
        round=snap.round,
        model_version=snap.model_version,
        deadline=iso_time(snap.deadline),
        base_url=Route.MODEL_BASE.format(version=snap.model_version),
        manifest_url=Route.ARTIFACT.format(name=MANIFEST_FILE),
        manifest_sha256=state.manifest_sha256,
        config=TaskConfig.asking(state.config.training),
        report_by=iso_time(slot.expires_at),
        dp=None if rounds.privacy is None else rounds.privacy.task(),
        secagg=secure,
    )
    return JSONResponse(body.model_dump())
