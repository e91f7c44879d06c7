"""The FastAPI application: the routers of :mod:`server.routes` over :mod:`server.rounds` and
:mod:`server.state`, the clock that applies deadlines, and the error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedper import __version__
from fedper.common.protocol import ErrorCode
from fedper.server.address_limit import PerAddressLimit
from fedper.server.config import ServerConfig
from fedper.server.errors import (
    ClientDisconnectedError,
    InternalErrorMiddleware,
    ProtocolError,
    client_disconnected_handler,
    protocol_error_handler,
    refusal_handler,
)
from fedper.server.refusals import RefusalError, ServerBusyError
from fedper.server.request_metrics import RequestTimer
from fedper.server.routes import admin, dashboard, devices, downloads, health, regions, rounds, secagg
from fedper.server.routes.devices import enrollment_spent
from fedper.server.state import ServerState, open_state
from fedper.server.storage import DatabaseBusyError

log = logging.getLogger("fedper.server")


def create_app(config: ServerConfig, state: ServerState | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.fedper = state or await to_thread.run_sync(open_state, config)
        tail = app.state.fedper.log_tail
        logging.getLogger("fedper.server").addHandler(tail)  # the dashboard's last log lines
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
            logging.getLogger("fedper.server").removeHandler(tail)
            app.state.fedper.db.close()

    app = FastAPI(
        title="fedper aggregation server",
        version=__version__,
        description="FedPer device protocol v1 (PROTOCOL.md): devices train base + personal head "
        "on-device and upload only the base; the server aggregates with sample-weighted FedAvg.",
        lifespan=lifespan,
    )
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(PerAddressLimit, limit=config.max_requests_per_address, retry_after=config.retry_after,
                       refused_early=enrollment_spent)  # fmt: skip
    app.add_middleware(RequestTimer)  # the outermost: it times every answer, a 429 or a 500 too
    app.add_exception_handler(ProtocolError, protocol_error_handler)
    app.add_exception_handler(RefusalError, refusal_handler)
    app.add_exception_handler(ClientDisconnectedError, client_disconnected_handler)

    @app.exception_handler(DatabaseBusyError)
    async def database_busy(_r: Request, exc: DatabaseBusyError) -> JSONResponse:
        log.warning(json.dumps({"event": "database_busy", "error": str(exc)}))
        busy = ServerBusyError("the server's database is busy; nothing was changed, retry later", config.retry_after)
        return await refusal_handler(_r, busy)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ErrorCode.BAD_REQUEST)
        return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def path_error(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"code": ErrorCode.NOT_FOUND, "message": "no such resource"}, status_code=404)

    for router in (health.router, devices.router, downloads.router, rounds.router, secagg.router, regions.router,
                   admin.router, dashboard.router):  # fmt: skip
        app.include_router(router)
    return app
