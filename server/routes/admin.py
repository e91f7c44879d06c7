"""Operator endpoints (admin token): revoke a device, stop the run, the newest base."""

from __future__ import annotations

import json
import logging
import secrets

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from fedper.common.protocol import (
    Enrolled,
    ErrorCode,
    Provisioned,
    ProvisionRequest,
    Revoked,
    RolledBack,
    Route,
    Stopped,
)
from fedper.server.auth import Operator, State
from fedper.server.credentials import new_token, token_hash
from fedper.server.refusals import ROOT_TAKES_NO_DEVICES, ForbiddenError, MalformedError, NotFoundError
from fedper.server.request_body import json_body, read_small
from fedper.server.routes.responses import ERRORS, OCTETS, file_response
from fedper.server.state import ServerState

log = logging.getLogger("fedper.server")
router = APIRouter()


@router.post(Route.ADMIN_DEVICES, status_code=201, response_model=Provisioned, responses=ERRORS)
async def provision(request: Request, _op: Operator, state: State) -> Provisioned:
    """Enroll ``count`` devices in one transaction, for an operator provisioning a
    fleet (their tokens go to the devices by the operator's own channel)."""
    if state.config.regions:
        raise ForbiddenError(ROOT_TAKES_NO_DEVICES)
    raw = await read_small(request, 4096, state.config.request_body_timeout)
    try:
        body = ProvisionRequest.model_validate(json_body(raw))
    except ValidationError as exc:
        raise MalformedError(ErrorCode.BAD_REQUEST, f"not a provisioning request: {exc.errors()[:1]}") from exc
    return await to_thread.run_sync(_provision, body, state)


def _provision(body: ProvisionRequest, state: ServerState) -> Provisioned:
    devices = [(f"d-{secrets.token_hex(8)}", new_token()) for _ in range(body.count)]
    state.db.devices.add_many([(d, token_hash(t)) for d, t in devices], body.platform)
    log.info(json.dumps({"event": "devices_provisioned", "count": body.count, "platform": body.platform}))
    state.rounds.enrolled()
    return Provisioned(devices=[Enrolled(device_id=d, token=t) for d, t in devices])


@router.post(Route.ADMIN_REVOKE, response_model=Revoked, responses=ERRORS)
def revoke(device_id: str, _op: Operator, state: State) -> Revoked:
    if not state.db.devices.revoke(device_id):
        raise NotFoundError(f"device {device_id[:80]!r}")
    withdrawn = state.rounds.withdraw(device_id)
    log.info(json.dumps({"event": "device_revoked", "device": device_id, "update_withdrawn": withdrawn}))
    return Revoked(device_id=device_id, revoked=True, update_withdrawn=withdrawn)


@router.post(Route.ADMIN_STOP, response_model=Stopped, responses=ERRORS)
def stop(_op: Operator, state: State) -> Stopped:
    state.rounds.stop()
    return Stopped()


@router.post(Route.ADMIN_ROLLBACK, response_model=RolledBack, responses=ERRORS)
def rollback(version: int, _op: Operator, state: State) -> RolledBack:
    """Reopen the run from model version ``version`` (docs/SERVER.md, "Publish checks and rollback")."""
    new_version, number = state.rounds.rollback(version)
    return RolledBack(rolled_back_to=version, model_version=new_version, round=number)


@router.get(Route.ADMIN_LATEST_BASE, responses={200: {"content": {OCTETS: {}}}, **ERRORS})
def latest_base(request: Request, _op: Operator, state: State) -> Response:
    found = state.rounds.version_file(state.db.versions.latest())
    assert found is not None
    return file_response(found[0], found[1], request, state)
