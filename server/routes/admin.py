"""Operator endpoints (admin token): revoke a device, stop the run, the newest base."""

from __future__ import annotations

import json
import logging

from fastapi import APIRouter, Request, Response

from fedper.common.protocol import Revoked, RolledBack, Route, Stopped
from fedper.server.auth import Operator, State
from fedper.server.errors import not_found
from fedper.server.routes.responses import ERRORS, OCTETS, file_response

log = logging.getLogger("fedper.server")
router = APIRouter()


@router.post(Route.ADMIN_REVOKE, response_model=Revoked, responses=ERRORS)
def revoke(device_id: str, _op: Operator, state: State) -> Revoked:
    if not state.db.revoke_device(device_id):
        raise not_found(f"device {device_id[:80]!r}")
    withdrawn = state.rounds.withdraw(device_id)
    log.info(json.dumps({"event": "device_revoked", "device": device_id, "update_withdrawn": withdrawn}))
    return Revoked(device_id=device_id, revoked=True, update_withdrawn=withdrawn)


@router.post(Route.ADMIN_STOP, response_model=Stopped, responses=ERRORS)
def stop(_op: Operator, state: State) -> Stopped:
    state.rounds.stop()
    return Stopped()


@router.post(Route.ADMIN_ROLLBACK, response_model=RolledBack, responses=ERRORS)
def rollback(version: int, _op: Operator, state: State) -> RolledBack:
    """Reopen the run from model version ``version`` (revision 1.4; docs/SERVER.md, Rollback)."""
    new_version, number = state.rounds.rollback(version)
    return RolledBack(rolled_back_to=version, model_version=new_version, round=number)


@router.get(Route.ADMIN_LATEST_BASE, responses={200: {"content": {OCTETS: {}}}, **ERRORS})
def latest_base(request: Request, _op: Operator, state: State) -> Response:
    found = state.rounds.version_file(state.db.latest_version())
    assert found is not None
    return file_response(found[0], found[1], request, state)
