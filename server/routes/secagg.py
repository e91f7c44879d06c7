"""A secure round's stages (PROTOCOL.md, "Secure aggregation"; docs/SECAGG.md): a device POSTs its part
of a stage and GETs what the server relays to it once the stage before is over (204 until then)."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from fedper.common.protocol import (
    Header,
    Route,
    SecAggAccepted,
    SecAggKeys,
    SecAggNeighbours,
    SecAggSealed,
    SecAggUnmaskAnswer,
    SecAggUnmaskRequest,
)
from fedper.server.auth import DeviceId, State
from fedper.server.refusals import NotFoundError, RunFinishedError, SecureMessageError
from fedper.server.request_body import BodyPace, json_body, read_small
from fedper.server.routes.responses import ERRORS, OCTETS
from fedper.server.state import ServerState

JSON_LIMIT = 64 * 1024
PER_DEVICE = 512  # bytes a stage's JSON may take per device of the cohort (a sealed share is ~300)
BODIES: dict[str, type[BaseModel]] = {"keys": SecAggKeys, "shares": SecAggSealed, "unmask": SecAggUnmaskAnswer}

router = APIRouter()


def _checked(state: ServerState, number: int) -> None:
    rounds = state.rounds
    if rounds.secure is None:
        raise NotFoundError("secure rounds on this server")
    if rounds.snapshot.finished:
        raise RunFinishedError()
    if not rounds.round_exists(number):
        raise NotFoundError(f"round {number}")


def _canonical(stage: str, body: bytes) -> bytes:
    """The body as its model re-encodes it (400 for JSON that is not, 422 for the wrong fields)."""
    try:
        model = BODIES[stage].model_validate(json_body(body))
    except ValidationError as exc:
        raise SecureMessageError(f"not a {stage} message: {exc.errors()[:1]}") from exc
    return model.model_dump_json().encode()


async def _post(state: ServerState, request: Request, device_id: str, number: int, stage: str) -> SecAggAccepted:
    _checked(state, number)
    secure = state.rounds.secure
    assert secure is not None
    c = state.config
    if stage == "masked":  # an update's size and pace: the upload's deadline and minimum rate
        limit = 4 * (secure.words + 2)  # the floats, a flag word under DP, the weight
        body = raw = await read_small(
            request, limit, BodyPace(c.upload_timeout, c.min_upload_rate, c.upload_rate_grace)
        )
    else:
        raw = await read_small(request, JSON_LIMIT + PER_DEVICE * c.slots, BodyPace(c.request_body_timeout))
        body = _canonical(stage, raw)
    unopened = request.headers.get(Header.SECAGG_UNOPENED, "") if stage == "masked" else ""
    if len(unopened) > PER_DEVICE * 8:
        raise SecureMessageError(f"{Header.SECAGG_UNOPENED} is longer than any cohort's ids")
    await to_thread.run_sync(state.rounds.secure_post, number, device_id, stage, body, unopened)
    if stage == "masked":  # a secure round's update
        state.metrics.accept(len(raw))
    else:
        state.metrics.received(len(raw))
    return SecAggAccepted(round=number, stage=stage)  # type: ignore[arg-type]


def _get(state: ServerState, device_id: str, number: int, stage: str) -> Response:
    _checked(state, number)
    payload: Any = state.rounds.secure_get(number, device_id, stage)
    if payload is None:
        secure = state.rounds.secure
        assert secure is not None
        wait = secure.retry_after(number, state.rounds.clock())
        return Response(status_code=204, headers={Header.RETRY_AFTER: str(wait)})
    response = JSONResponse(payload)
    state.metrics.sent(len(response.body))
    return response


@router.post(Route.SECAGG_KEYS, status_code=202, response_model=SecAggAccepted, responses=ERRORS)
async def post_keys(round_number: int, request: Request, device_id: DeviceId, state: State) -> SecAggAccepted:
    return await _post(state, request, device_id, round_number, "keys")


@router.get(Route.SECAGG_KEYS, response_model=SecAggNeighbours, responses={204: {"description": "not yet"}, **ERRORS})
def get_keys(round_number: int, device_id: DeviceId, state: State) -> Response:
    return _get(state, device_id, round_number, "keys")


@router.post(Route.SECAGG_SHARES, status_code=202, response_model=SecAggAccepted, responses=ERRORS)
async def post_shares(round_number: int, request: Request, device_id: DeviceId, state: State) -> SecAggAccepted:
    return await _post(state, request, device_id, round_number, "shares")


@router.get(Route.SECAGG_SHARES, response_model=SecAggSealed, responses={204: {"description": "not yet"}, **ERRORS})
def get_shares(round_number: int, device_id: DeviceId, state: State) -> Response:
    return _get(state, device_id, round_number, "shares")


@router.post(
    Route.SECAGG_MASKED,
    status_code=202,
    response_model=SecAggAccepted,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {"required": True, "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}}}
    },
)
async def post_masked(round_number: int, request: Request, device_id: DeviceId, state: State) -> SecAggAccepted:
    return await _post(state, request, device_id, round_number, "masked")


@router.get(
    Route.SECAGG_UNMASK, response_model=SecAggUnmaskRequest, responses={204: {"description": "not yet"}, **ERRORS}
)
def get_unmask(round_number: int, device_id: DeviceId, state: State) -> Response:
    return _get(state, device_id, round_number, "unmask")


@router.post(Route.SECAGG_UNMASK, status_code=202, response_model=SecAggAccepted, responses=ERRORS)
async def post_unmask(round_number: int, request: Request, device_id: DeviceId, state: State) -> SecAggAccepted:
    return await _post(state, request, device_id, round_number, "unmask")
