"""The dashboard's document from the server's state: read in about a millisecond whatever the
run's length (:mod:`server.run_history` reads each ended round once, and each ended round's row
is built once)."""

from __future__ import annotations

from fedper.server.dashboard_data import (
    SHOWN_LOG_LINES,
    SHOWN_ROUNDS,
    DashboardData,
    ProcessCounts,
    RunSummary,
    open_row,
)
from fedper.server.state import ServerState


def collect(state: ServerState) -> DashboardData:
    """The dashboard's document, from the run's records and this process's counts."""
    rounds, config, db = state.rounds, state.config, state.db
    snap = rounds.snapshot
    now = rounds.clock()
    rows = state.ended_rows.rows(state.history.ended()[-SHOWN_ROUNDS:])
    if snap.is_open and not snap.finished:
        received = rounds.received(snap.round)
        held = db.cohort.count_held(snap.round, now)
        rows.append(open_row(snap.round, snap.model_version, snap.opened_at, now, held, received,
                             rounds.refused_in(snap.round)))  # fmt: skip
    run_state = db.run_state()
    totals = state.metrics.totals()
    privacy = None if rounds.privacy is None else rounds.privacy.spent()
    run = RunSummary(state=run_state.value, round=snap.round, rounds_total=config.rounds,
                     rounds_closed=snap.rounds_closed, model_version=db.versions.latest(), devices=db.devices.count(),
                     target_clients=config.target_clients, min_clients=config.min_clients, slots=config.slots,
                     round_timeout=config.round_timeout, draining=rounds.draining, secure=config.secure.secagg,
                     privacy=privacy)  # fmt: skip
    process = ProcessCounts(started_at=state.metrics.started_at, refused=totals.refused, answers=totals.answers,
                            accepted=totals.accepted, bytes_in=totals.bytes_in, bytes_out=totals.bytes_out)  # fmt: skip
    versions = state.history.versions()
    return DashboardData(now=now, run=run, rounds=rows, versions=versions, process=process,
                         log=state.log_tail.lines(SHOWN_LOG_LINES))  # fmt: skip
