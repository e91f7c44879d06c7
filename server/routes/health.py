"""Unauthenticated read-only endpoints: health, run status, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from fedper.protocol import Health, Route, Status
from server.auth import State

router = APIRouter()


@router.get(Route.HEALTH, response_model=Health)
def health() -> Health:
    return Health()


@router.get(Route.STATUS, response_model=Status)
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


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(state: State) -> str:
    snap = state.rounds.snapshot
    return state.metrics.render(
        snap.rounds_closed, snap.round, state.rounds.aggregation_seconds, state.uploads_in_flight
    )
