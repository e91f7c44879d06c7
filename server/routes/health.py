"""Unauthenticated read-only endpoints: health, run status, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from fedper.common.protocol import Health, Route, Status
from fedper.server.auth import State
from fedper.server.metrics_registry import METRICS_PATH
from fedper.server.routes.responses import ERRORS

router = APIRouter()


@router.get(Route.HEALTH, response_model=Health, responses={503: ERRORS[503]})
def health(state: State) -> Health:
    """200 only if the database takes writes: 503 ``server_busy`` while another process holds
    its write lock, as every enrollment and upload would then get. A draining server (a full
    disk) answers 200: it still serves downloads (/v1/status says it drains)."""
    if not state.db.read_only:
        state.db.writable()
    return Health()


@router.get(Route.STATUS, response_model=Status)
def status(state: State) -> Status:
    snap = state.rounds.snapshot
    return Status(
        state="finished" if snap.finished else "running",
        round=snap.round,
        model_version=state.db.versions.latest(),
        rounds_total=state.config.rounds,
        rounds_closed=snap.rounds_closed,
        devices=state.db.devices.count(),  # counted in memory
        draining=state.rounds.draining is not None,
        privacy=None if state.rounds.privacy is None else state.rounds.privacy.spent(),
    )


@router.get(METRICS_PATH, response_class=PlainTextResponse)
def metrics(state: State) -> Response:
    snap = state.rounds.snapshot
    rounds = state.rounds
    text = state.metrics.render(snap.rounds_closed, snap.round, rounds.aggregation_seconds, len(state.places),
                                rounds.aggregation_counts, rounds.rounds_refused,
                                rounds.draining is not None,
                                None if rounds.privacy is None else rounds.privacy.spent(),
                                state.history.ended(), (rounds.disk.free_bytes(), rounds.disk.reserve),
                                state.config.round_timeout, state.history.versions())  # fmt: skip
    return Response(text, media_type=CONTENT_TYPE_LATEST)
