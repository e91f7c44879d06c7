"""The typed records the storage hands out: no caller sees a database row."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RoundState(StrEnum):
    """How a round stands (the ``rounds`` table's CHECK; the protocol's ``RoundInfo.state``)."""

    OPEN = "open"
    CLOSED = "closed"  # aggregated: it made a model version
    ABANDONED = "abandoned"  # ended without enough updates, or by a restart or rollback
    STOPPED = "stopped"  # the operator stopped the run while it was open


class RunState(StrEnum):
    """How the run stands (the ``run`` table's CHECK)."""

    WAITING = "waiting"  # round 1 is open, its clock not started until --start-devices devices enrolled
    RUNNING = "running"
    FINISHED = "finished"  # --rounds closed, the privacy budget spent, or the operator stopped it


@dataclass(frozen=True)
class Device:
    id: str
    token_hash: str
    revoked: bool


@dataclass(frozen=True)
class ModelVersion:
    version: int
    sha256: str
    file: str


@dataclass(frozen=True)
class SecAggSession:
    """A secure round's fixed part (docs/SECAGG.md): its session id, neighbour graph, threshold,
    encoding and when each stage ends at the latest."""

    round: int
    session: str
    graph: dict[str, list[str]]
    threshold: int
    clip: float
    weight_cap: int
    stage_ends: dict[str, float]
    flags: int = 0  # words between the delta and the weight: 1 under DP (the unclipped bit)


@dataclass(frozen=True)
class Round:
    round: int
    state: RoundState
    model_version: int
    opened_at: float
    deadline: float | None
    closed_at: float | None
    result_version: int | None
    metrics: dict[str, Any] | None
    reason: str | None = None  # why it was abandoned, when the server knows
    rolled_back: bool = False  # a rollback undid it: its updates use up no participation
    checked_in: int | None = None  # devices that checked in, counted when it ended (None: open, or older)
    drawn: int | None = None  # devices holding a slot when it ended


@dataclass(frozen=True)
class RoundEnding:
    """What the server knows of a round that ends and the database does not: the uploads it refused
    while the round was open (by error code), and how many slots make its cohort full (0: the
    draw fixes the cohort, as under DP or secure aggregation), and what robust aggregation did."""

    refused: dict[str, int] = field(default_factory=dict)
    fill_rank: int = 0
    aggregation: dict[str, Any] | None = None  # a closed round's robust aggregation report


@dataclass(frozen=True)
class EndedRound:
    """An ended round as the operator's metrics and dashboard show it: how long it was open, how
    many devices checked in and held a slot, how many reported (updates accepted), its upload
    refusals by code, a secure round's messages per stage, and how long its cohort took to fill
    (None: never full, or ended before the server recorded it)."""

    round: int
    state: RoundState
    ended_at: float
    seconds: float
    checked_in: int | None
    drawn: int | None
    reported: int
    model_version: int = 0
    opened_at: float = 0.0
    reason: str | None = None
    refused: dict[str, int] = field(default_factory=dict)
    secure_stages: dict[str, int] = field(default_factory=dict)
    fill_seconds: float | None = None
    aggregation: dict[str, Any] | None = None


@dataclass(frozen=True)
class Slot:
    """A device's place in a round's cohort; ``expires_at`` None: it lasts as long as the round."""

    round: int
    device_id: str
    assigned_at: float
    expires_at: float | None


@dataclass(frozen=True)
class StoredUpdate:
    round: int
    device_id: str
    num_samples: int
    base_version: int
    file: str | None
    metrics: dict[str, float]
    unclipped: bool | None = None  # under DP: the delta was within the clip before clipping
