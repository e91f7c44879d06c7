"""The FastAPI application: thin routes over :mod:`server.rounds` and :mod:`server.state`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedper import __version__
from fedper.manifest import MANIFEST_FILE
from fedper.protocol import (
    Accepted,
    Enrolled,
    ErrorCode,
    Header,
    Health,
    Revoked,
    RoundInfo,
    Route,
    Status,
    Stopped,
    Task,
    TaskConfig,
)
from server import strict_json
from server.auth import AnyCaller, DeviceId, Operator, State, check_not_throttled, client_address, failed
from server.config import ServerConfig
from server.credentials import new_token, same_secret, token_hash
from server.errors import (
    ClientDisconnectedError,
    InternalErrorMiddleware,
    ProtocolError,
    bad_request,
    client_disconnected_handler,
    not_found,
    protocol_error_handler,
    rate_limited,
    run_finished,
)
from server.request_body import read_small, streamed_to_file
from server.rounds import iso_time
from server.state import ServerState, open_state
from server.upload_validation import validate

log = logging.getLogger("fedper.server")
JSON_LIMIT = 64 * 1024
MAX_PLATFORM_LENGTH = 128
OCTETS = Header.OCTET_STREAM


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {
        "description": text,
        "content": {"application/json": {"example": {"code": "...", "message": "..."}}},
    }
    for code, text in {
        400: "malformed body", 401: "missing/unknown token", 403: "wrong role", 404: "unknown",
        408: "body too slow", 409: "conflict", 410: "run finished", 413: "too large", 422: "wrong content",
        429: "rate limited", 500: "server fault (internal_error, with a request_id)",
        503: "too many uploads in flight (server_busy)",
    }.items()
}  # fmt: skip


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


def _file_response(path: Path, sha256: str, request: Request, state: ServerState) -> Response:
    etag = f'"{sha256}"'
    if etag in [t.strip() for t in request.headers.get(Header.IF_NONE_MATCH, "").split(",")]:
        return Response(status_code=304, headers={Header.ETAG: etag})
    state.metrics.sent(path.stat().st_size)
    return FileResponse(path, media_type=OCTETS, headers={Header.ETAG: etag})


def _enrollment(body: bytes) -> tuple[object, str | None]:
    """(enrollment_key, platform) from an enrollment body, or a 400."""
    try:
        data = strict_json.loads(body)
    except strict_json.JsonError as exc:
        raise bad_request(ErrorCode.MALFORMED_JSON, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise bad_request(ErrorCode.MALFORMED_JSON, "the body must be a JSON object")
    platform = data.get("platform")
    if platform is not None and not (isinstance(platform, str) and len(platform) <= MAX_PLATFORM_LENGTH):
        raise bad_request(
            ErrorCode.BAD_REQUEST, f"platform must be a string of at most {MAX_PLATFORM_LENGTH} characters"
        )
    return data.get("enrollment_key"), platform


def create_app(config: ServerConfig, state: ServerState | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.fedper = state or await to_thread.run_sync(open_state, config)
        interval = max(0.05, min(1.0, config.round_timeout / 20)) if config.round_timeout else 1.0

        async def apply_clock() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await to_thread.run_sync(app.state.fedper.rounds.tick)
                except Exception:  # keep ticking; the error is logged
                    log.exception(json.dumps({"event": "tick_failed"}))

        task = asyncio.create_task(apply_clock())
        try:
            yield
        finally:
            task.cancel()
            app.state.fedper.db.close()

    app = FastAPI(
        title="fedper aggregation server",
        version=__version__,
        description="FedPer device protocol v1 (PROTOCOL.md): devices train base + personal head "
        "on-device and upload only the base; the server aggregates with sample-weighted FedAvg.",
        lifespan=lifespan,
    )
    app.add_middleware(InternalErrorMiddleware)
    app.add_exception_handler(ProtocolError, protocol_error_handler)
    app.add_exception_handler(ClientDisconnectedError, client_disconnected_handler)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ErrorCode.BAD_REQUEST)
        return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def path_error(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"code": ErrorCode.NOT_FOUND, "message": "no such resource"}, status_code=404)

    @app.get(Route.HEALTH, response_model=Health)
    def health() -> Health:
        return Health()

    @app.post(Route.DEVICES, status_code=201, response_model=Enrolled, responses=ERRORS)
    async def enroll(request: Request, state: State) -> Enrolled:
        check_not_throttled(request, state)
        body = await read_small(request, JSON_LIMIT, state.config.upload_timeout)
        key, platform = _enrollment(body)
        if not isinstance(key, str) or not same_secret(key, state.secrets.enrollment_key):
            raise failed(request, state, "wrong enrollment key")
        allowed, wait = state.limiter.allow(client_address(request))
        if not allowed:
            raise rate_limited("too many enrollments from this address", wait)
        device_id, token = f"d-{secrets.token_hex(8)}", new_token()
        await to_thread.run_sync(state.db.add_device, device_id, token_hash(token), platform)
        log.info(json.dumps({"event": "device_enrolled", "device": device_id, "platform": platform}))
        return Enrolled(device_id=device_id, token=token)

    @app.get(Route.TASK, response_model=Task, responses={204: {"description": "no task now"}, **ERRORS})
    def task(device_id: DeviceId, state: State) -> Response:
        snap = state.rounds.snapshot
        if snap.finished:
            raise run_finished()
        retry = {Header.RETRY_AFTER: str(state.config.retry_after)}
        if snap.state != "open" or state.db.has_update(snap.round, device_id):
            return Response(status_code=204, headers=retry)
        c = state.config
        body = Task(
            round=snap.round,
            model_version=snap.model_version,
            deadline=iso_time(snap.deadline),
            base_url=Route.MODEL_BASE.format(version=snap.model_version),
            manifest_url=Route.ARTIFACT.format(name=MANIFEST_FILE),
            manifest_sha256=state.manifest_sha256,
            config=TaskConfig(local_epochs=c.local_epochs, batch_size=c.batch_size,
                              learning_rate=c.learning_rate, momentum=c.momentum),
        )  # fmt: skip
        return JSONResponse(body.model_dump())

    @app.get(Route.MODEL_BASE, responses={200: {"content": {OCTETS: {}}}, 304: {}, **ERRORS})
    def model_base(version: int, request: Request, _who: AnyCaller, state: State) -> Response:
        found = state.rounds.version_file(version)
        if found is None:
            raise not_found(f"model version {version}")
        return _file_response(found[0], found[1], request, state)

    @app.get(Route.ARTIFACT, responses={200: {"content": {OCTETS: {}}}, 304: {}, **ERRORS})
    def artifact(name: str, request: Request, _who: AnyCaller, state: State) -> Response:
        path = state.artifact_path(name)
        if path is None:
            raise not_found(f"artifact {name[:80]!r}")
        sha = state.manifest_sha256 if name == "manifest.json" else state.manifest.sha256[name]
        return _file_response(path, sha, request, state)

    @app.post(
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

    @app.get(Route.ROUND, response_model=RoundInfo, responses=ERRORS)
    def round_status(round_number: int, _who: AnyCaller, state: State) -> RoundInfo:
        info = state.rounds.round_info(round_number)
        if info is None:
            raise not_found(f"round {round_number}")
        return info

    @app.get(Route.STATUS, response_model=Status)
    def status(state: State) -> Status:
        snap = state.rounds.snapshot
        return Status(
            state="finished" if snap.finished else "running",
            round=snap.round,
            model_version=state.db.latest_version(),
            rounds_total=state.config.rounds,
            rounds_closed=snap.rounds_closed,
            devices=state.db.count_devices(),
        )

    @app.post(Route.ADMIN_REVOKE, response_model=Revoked, responses=ERRORS)
    def revoke(device_id: str, _op: Operator, state: State) -> Revoked:
        if not state.db.revoke_device(device_id):
            raise not_found(f"device {device_id[:80]!r}")
        withdrawn = state.rounds.withdraw(device_id)
        log.info(json.dumps({"event": "device_revoked", "device": device_id, "update_withdrawn": withdrawn}))
        return Revoked(device_id=device_id, revoked=True, update_withdrawn=withdrawn)

    @app.post(Route.ADMIN_STOP, response_model=Stopped, responses=ERRORS)
    def stop(_op: Operator, state: State) -> Stopped:
        state.rounds.stop()
        return Stopped()

    @app.get(Route.ADMIN_LATEST_BASE, responses={200: {"content": {OCTETS: {}}}, **ERRORS})
    def latest_base(request: Request, _op: Operator, state: State) -> Response:
        found = state.rounds.version_file(state.db.latest_version())
        assert found is not None
        return _file_response(found[0], found[1], request, state)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(state: State) -> str:
        snap = state.rounds.snapshot
        return state.metrics.render(
            snap.rounds_closed, snap.round, state.rounds.aggregation_seconds, state.uploads_in_flight
        )

    return app
