"""Typed request dependencies: who is calling (a device, the operator), from the bearer token.

Failed authentications are counted per client address (an IPv6 address as its /64), apart
for each kind of credential. An address over the limit of wrong bearer tokens gets 429 for
every wrong token; a valid token still works from it, device or admin, since other tokens'
failures must not lock out the operator or honest phones behind the same address (a carrier
NAT, a proxy not in ``--forwarded-allow-ips``). That gives a guesser nothing: device tokens
are 256 random bits and the admin token at least 32 characters the server checks at start, so
telling a valid one from a throttled guess needs the secret itself. Wrong enrollment keys are
counted on their own, and the right key always enrolls (it ships inside every app: nothing to
guess), so neither kind of failure from one phone behind a carrier NAT stops the others from
enrolling.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request

from fedper.server.credentials import same_secret, token_hash
from fedper.server.rate_limit import address_key, failed_attempt
from fedper.server.refusals import ForbiddenError, UnauthorizedError
from fedper.server.state import ServerState


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.fedper
    return state


State = Annotated[ServerState, Depends(get_state)]


@dataclass(frozen=True)
class Caller:
    role: Literal["device", "operator", "region"]
    device_id: str | None = None
    region: int | None = None  # a regional server's number, at a root


def client_address(request: Request) -> str:
    """The peer's address, or the one a trusted proxy reported (uvicorn applies only those)."""
    return request.client.host if request.client else "unknown"


def limit_key(request: Request) -> str:
    """What per-address limits count under (:func:`server.rate_limit.address_key`)."""
    return address_key(client_address(request))


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError("send Authorization: Bearer <token>")
    return token.strip()


def caller(request: Request, state: State) -> Caller:
    token = _bearer(request)
    row = state.db.devices.by_token_hash(token_hash(token))
    if row is not None and not row.revoked and same_secret(row.token_hash, token_hash(token)):
        return Caller("device", row.id)
    if same_secret(token, state.secrets.admin_token):
        return Caller("operator")
    region = state.region_tokens.get(token_hash(token))
    if region is not None:  # found by the hash of a 256-bit token: nothing to learn from the timing
        return Caller("region", region=region)
    why = "this device has been revoked" if row is not None and row.revoked else "unknown token"
    raise failed_attempt(state.auth_failures, limit_key(request), why)


AnyCaller = Annotated[Caller, Depends(caller)]


def device(who: AnyCaller) -> str:
    if who.role != "device" or who.device_id is None:
        raise ForbiddenError("this endpoint is for devices; the admin token cannot use it")
    return who.device_id


def operator(who: AnyCaller) -> Caller:
    if who.role != "operator":
        raise ForbiddenError("this endpoint needs the admin token")
    return who


def region(who: AnyCaller) -> int:
    if who.role != "region" or who.region is None:
        raise ForbiddenError("this endpoint is for a root's regional servers (their region token)")
    return who.region


def browser_operator(request: Request, state: State) -> Caller:
    """The operator in a browser (the dashboard): HTTP Basic with the admin token as the password
    (any user name), or the bearer token. A 401 asks the browser for it; wrong tokens count
    against the address as every other failed authentication does."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    token = value.strip() if scheme.lower() == "bearer" else None
    if scheme.lower() == "basic":
        try:
            token = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8 (UnicodeDecodeError)
            token = None
    if token and same_secret(token, state.secrets.admin_token):
        return Caller("operator")
    refusal = (
        failed_attempt(state.auth_failures, limit_key(request), "wrong admin token") if token
        else UnauthorizedError("log in with the admin token as the password (any user name)")
    )  # fmt: skip
    refusal.challenge = BASIC_CHALLENGE
    raise refusal


BASIC_CHALLENGE = 'Basic realm="fedper dashboard", charset="UTF-8"'
DeviceId = Annotated[str, Depends(device)]
Operator = Annotated[Caller, Depends(operator)]
RegionNumber = Annotated[int, Depends(region)]
BrowserOperator = Annotated[Caller, Depends(browser_operator)]
