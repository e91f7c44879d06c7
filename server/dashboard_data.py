"""What the operator's dashboard draws (``GET /dashboard/data``, admin token): the run's status,
its rounds over time with their cohorts and refusals, what devices reported per model version,
this process's counts and the server's last log lines (:mod:`server.dashboard_view` fills it).

It is an operator view outside the device protocol (PROTOCOL.md): fields may be added."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fedper.common.protocol import PrivacySpent
from fedper.server.run_history import VersionReport
from fedper.server.storage import EndedRound, RoundState

DASHBOARD_PATH = "/dashboard"  # operator pages, outside the device protocol
DASHBOARD_DATA_PATH = "/dashboard/data"
SHOWN_ROUNDS = 300  # the newest ended rounds the page draws
SHOWN_LOG_LINES = 40


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RoundRow(_Data):
    round: int
    state: str
    model_version: int
    opened_at: float
    ended_at: float | None  # None: open
    seconds: float  # open for, so far if open
    checked_in: int | None  # None: not counted (open, or ended before the server counted)
    drawn: int | None
    reported: int
    refused: dict[str, int]
    secure_stages: dict[str, int]
    fill_seconds: float | None  # None: its cohort never filled, or not known
    reason: str | None
    clipped: int | None = None  # robust aggregation's report of a closed round (None: none recorded)
    capped: int | None = None


class RunSummary(_Data):
    state: str  # waiting, running, finished
    round: int
    rounds_total: int
    rounds_closed: int
    model_version: int
    devices: int
    target_clients: int
    min_clients: int
    slots: int
    round_timeout: float
    draining: str | None
    secure: bool
    privacy: PrivacySpent | None


class ProcessCounts(_Data):
    """Since this server process started."""

    started_at: float
    refused: dict[str, int]
    answers: dict[str, int]
    accepted: int
    bytes_in: int
    bytes_out: int


class DashboardData(_Data):
    now: float
    run: RunSummary
    rounds: list[RoundRow]  # oldest first; the open round last
    versions: list[VersionReport]
    process: ProcessCounts
    log: list[str]


class EndedRows:
    """Each ended round's row, built once: an ended round never changes, and a poll shows hundreds."""

    def __init__(self) -> None:
        self._rows: dict[int, RoundRow] = {}

    def rows(self, ended: list[EndedRound]) -> list[RoundRow]:
        rows = [self._rows.get(r.round) or ended_row(r) for r in ended]
        self._rows = {row.round: row for row in rows}  # only the rows shown stay
        return rows


def ended_row(r: EndedRound) -> RoundRow:
    return RoundRow(round=r.round, state=r.state.value, model_version=r.model_version, opened_at=r.opened_at,
                    ended_at=r.ended_at, seconds=r.seconds, checked_in=r.checked_in, drawn=r.drawn,
                    reported=r.reported, refused=r.refused, secure_stages=r.secure_stages,
                    fill_seconds=r.fill_seconds, reason=r.reason,
                    clipped=None if r.aggregation is None else r.aggregation.get("clipped"),
                    capped=None if r.aggregation is None else r.aggregation.get("capped"))  # fmt: skip


def open_row(number: int, version: int, opened_at: float, now: float, held: int, received: int,
             refused: dict[str, int]) -> RoundRow:  # fmt: skip
    return RoundRow(round=number, state=RoundState.OPEN.value, model_version=version, opened_at=opened_at,
                    ended_at=None, seconds=max(0.0, now - opened_at), checked_in=None, drawn=held, reported=received,
                    refused=refused, secure_stages={}, fill_seconds=None, reason=None)  # fmt: skip
