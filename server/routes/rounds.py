"""Uploads of base updates into a round, and a round's state."""

from __future__ import annotations

import json
import logging

from anyio import to_thread
from fastapi import APIRouter, Request

from fedper.common.protocol import Accepted, RoundInfo, Route
from fedper.server.auth import AnyCaller, DeviceId, State
from fedper.server.disk_room import out_of_space
from fedper.server.errors import ProtocolError, answer, not_found, run_finished
from fedper.server.refusals import RefusalError
from fedper.server.request_body import BodyPace, streamed_to_file
from fedper.server.routes.responses import ERRORS, OCTETS
from fedper.server.state import ServerState
from fedper.server.storage import StorageError
from fedper.server.upload_validation import validate

log = logging.getLogger("fedper.server")
router = APIRouter()


@router.post(
    Route.UPDATES,
    status_code=202,
    response_model=Accepted,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload(round_number: int, request: Request, device_id: DeviceId, state: State) -> Accepted:
    """The checks run in the protocol's order (revision 1.4): 410, 404, the 409s that need no
    body, 409 ``upload_in_progress``, 503, 413, 408, 400, 422, then the 409s again (the body took
    time) and ``stale_base_version``."""
    rounds, c = state.rounds, state.config
    try:
        if rounds.snapshot.finished:
            raise run_finished()
        if not rounds.round_exists(round_number):
            raise not_found(f"round {round_number}")
        await to_thread.run_sync(rounds.check_admission, device_id, round_number)
        with state.places.take(device_id, round_number) as place:
            pace = BodyPace(c.upload_timeout, c.min_upload_rate, c.upload_rate_grace)
            async with streamed_to_file(request, state.max_upload_bytes, pace, rounds.store, place) as body:
                size = body.stat().st_size
                checked = c.max_update_norm or rounds.privacy is not None
                base = await to_thread.run_sync(rounds.round_base, round_number) if checked else None
                clip = None if rounds.privacy is None else rounds.privacy.clip()
                parsed = await to_thread.run_sync(
                    validate, body, state.manifest, c.max_num_samples, base, c.max_update_norm, clip
                )
            staged = await to_thread.run_sync(rounds.stage, device_id, round_number, parsed)
            try:
                received = await to_thread.run_sync(rounds.commit, staged)
            finally:
                rounds.discard(staged)  # a no-op once committed (the file was renamed away)
    except (OSError, StorageError) as exc:
        if not out_of_space(exc):
            raise
        error = answer(rounds.out_of_space(exc))
        state.metrics.reject(error.code)
        raise error from exc
    except RefusalError as exc:
        raise _rejected(state, device_id, round_number, answer(exc)) from exc
    except ProtocolError as exc:
        _rejected(state, device_id, round_number, exc)
        raise
    state.metrics.accept(size)
    log.info(json.dumps({"event": "update_accepted", "device": device_id,
                         "round": round_number, "received": received}))  # fmt: skip
    return Accepted(round=round_number, accepted=True, received=received)


def _rejected(state: ServerState, device_id: str, round_number: int, error: ProtocolError) -> ProtocolError:
    """Count and log a refused upload; returns its answer."""
    state.metrics.reject(error.code)
    log.info(json.dumps({"event": "upload_rejected", "device": device_id,
                         "round": round_number, "code": error.code}))  # fmt: skip
    return error


@router.get(Route.ROUND, response_model=RoundInfo, responses=ERRORS)
def round_status(round_number: int, _who: AnyCaller, state: State) -> RoundInfo:
    info = state.rounds.round_info(round_number)
    if info is None:
        raise not_found(f"round {round_number}")
    return info
