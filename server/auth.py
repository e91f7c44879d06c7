"""Typed request dependencies: who is calling (a device, the operator), from the bearer token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request

from server.credentials import same_secret, token_hash
from server.errors import forbidden, unauthorized
from server.state import ServerState


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.fedper
    return state


State = Annotated[ServerState, Depends(get_state)]


@dataclass(frozen=True)
class Caller:
    role: Literal["device", "operator"]
    device_id: str | None = None


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("send Authorization: Bearer <token>")
    return token.strip()


def caller(request: Request, state: State) -> Caller:
    token = _bearer(request)
    if same_secret(token, state.secrets.admin_token):
        return Caller("operator")
    row = state.db.device_by_token_hash(token_hash(token))
    if row is None or not same_secret(row["token_hash"], token_hash(token)):
        raise unauthorized("unknown token")
    if row["revoked"]:
        raise unauthorized("this device has been revoked")
    return Caller("device", str(row["id"]))


AnyCaller = Annotated[Caller, Depends(caller)]


def device(who: AnyCaller) -> str:
    if who.role != "device" or who.device_id is None:
        raise forbidden("this endpoint is for devices; the admin token cannot use it")
    return who.device_id


def operator(who: AnyCaller) -> Caller:
    if who.role != "operator":
        raise forbidden("this endpoint needs the admin token")
    return who


DeviceId = Annotated[str, Depends(device)]
Operator = Annotated[Caller, Depends(operator)]
