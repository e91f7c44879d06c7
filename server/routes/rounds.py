"""Uploads of base updates into a round, and a round's state."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

from anyio import to_thread
from fastapi import APIRouter, Request

from fedper.protocol import Accepted, ErrorCode, Header, RoundInfo, Route
from server.auth import AnyCaller, DeviceId, State
from server.errors import ProtocolError, not_found, run_finished
from server.request_body import streamed_to_file
from server.routes.responses import ERRORS, OCTETS
from server.state import ServerState
from server.upload_validation import validate

log = logging.getLogger("fedper.server")
router = APIRouter()


@contextlib.contextmanager
def _upload_slot(state: ServerState) -> Iterator[None]:
    """One of ``--max-inflight-uploads``, or 503 ``server_busy`` (nothing is read or stored)."""
    if state.uploads_in_flight >= state.config.max_inflight_uploads:
        message = "the server is receiving as many uploads as it can; retry later"
        raise ProtocolError(503, ErrorCode.SERVER_BUSY, message, {Header.RETRY_AFTER: str(state.config.retry_after)})
    state.uploads_in_flight += 1  # only touched on the event loop: no lock needed
    try:
        yield
    finally:
        state.uploads_in_flight -= 1


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
    """The checks run in the protocol's order: 410, 503, 404, 413, 408, 400, 422, 409."""
    rounds, c = state.rounds, state.config
    try:
        if rounds.snapshot.finished:
            raise run_finished()
        with _upload_slot(state):
            if not rounds.round_exists(round_number):
                raise not_found(f"round {round_number}")
            async with streamed_to_file(request, state.max_upload_bytes, c.upload_timeout, rounds.store) as body:
                size = body.stat().st_size
                base = await to_thread.run_sync(rounds.round_base, round_number) if c.max_update_norm else None
                parsed = await to_thread.run_sync(
                    validate, body, state.manifest, c.max_num_samples, base, c.max_update_norm
                )
            staged = await to_thread.run_sync(rounds.stage, device_id, round_number, parsed)
            try:
                received = await to_thread.run_sync(rounds.commit, staged)
            finally:
                rounds.discard(staged)  # a no-op once committed (the file was renamed away)
    except ProtocolError as exc:
        state.metrics.reject(exc.code)
        log.info(json.dumps({"event": "upload_rejected", "device": device_id,
                             "round": round_number, "code": exc.code}))  # fmt: skip
        raise
    state.metrics.accept(size)
    log.info(json.dumps({"event": "update_accepted", "device": device_id,
                         "round": round_number, "received": received}))  # fmt: skip
    return Accepted(round=round_number, accepted=True, received=received)


@router.get(Route.ROUND, response_model=RoundInfo, responses=ERRORS)
def round_status(round_number: int, _who: AnyCaller, state: State) -> RoundInfo:
    info = state.rounds.round_info(round_number)
    if info is None:
        raise not_found(f"round {round_number}")
    return info
