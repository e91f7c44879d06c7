"""A tree of servers, at its root (PROTOCOL.md, "Regional aggregation"; docs/SCALING.md): a
regional server forwards its sum of the round and asks where the root stands."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Request

from fedper.common.protocol import RegionAccepted, RegionView, Route
from fedper.server.auth import RegionNumber, State
from fedper.server.refusals import ForbiddenError
from fedper.server.regional_intake import RegionalIntake
from fedper.server.request_body import BodyPace, read_small
from fedper.server.routes.responses import ERRORS
from fedper.server.routes.rounds import BINARY_BODY
from fedper.server.state import ServerState

router = APIRouter()


def _intake(state: ServerState, caller: int, region: int) -> RegionalIntake:
    if caller != region:
        raise ForbiddenError(f"this token is region {caller}'s, not region {region}'s")
    intake = state.rounds.regional
    assert intake is not None  # region tokens exist only at a root
    return intake


@router.post(Route.REGION_SUM, status_code=202, response_model=RegionAccepted, responses=ERRORS,
             openapi_extra={"requestBody": BINARY_BODY})  # fmt: skip
async def regional_sum(
    round_number: int, region: int, request: Request, caller: RegionNumber, state: State
) -> RegionAccepted:
    intake = _intake(state, caller, region)
    config = state.config
    pace = BodyPace(config.upload_timeout, config.min_upload_rate, config.upload_rate_grace)
    data = await read_small(request, intake.limit, pace)
    state.metrics.received(len(data))  # fedper_bytes_received: what the root takes in, as a server's uploads
    return await to_thread.run_sync(intake.accept, round_number, region, data)


@router.get(Route.REGION, response_model=RegionView, responses=ERRORS)
def region_view(region: int, caller: RegionNumber, state: State) -> RegionView:
    return _intake(state, caller, region).view(region)
