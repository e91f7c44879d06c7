"""Uploads of base updates into a round, and a round's state."""

from __future__ import annotations

from fastapi import APIRouter, Request

from fedper.common.protocol import Accepted, RoundInfo, Route
from fedper.server.auth import AnyCaller, DeviceId, State
from fedper.server.refusals import NotFoundError
from fedper.server.request_body import body_of
from fedper.server.routes.responses import ERRORS, OCTETS

router = APIRouter()
BINARY_BODY = {"required": True, "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}}}


@router.post(Route.UPDATES, status_code=202, response_model=Accepted, responses=ERRORS,
             openapi_extra={"requestBody": BINARY_BODY})  # fmt: skip
async def upload(round_number: int, request: Request, device_id: DeviceId, state: State) -> Accepted:
    received = await state.uploads.receive(device_id, round_number, body_of(request))
    return Accepted(round=round_number, accepted=True, received=received)


@router.get(Route.ROUND, response_model=RoundInfo, responses=ERRORS)
def round_status(round_number: int, _who: AnyCaller, state: State) -> RoundInfo:
    info = state.rounds.round_info(round_number)
    if info is None:
        raise NotFoundError(f"round {round_number}")
    return info
