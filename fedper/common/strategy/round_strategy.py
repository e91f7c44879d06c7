"""What every round mode answers, as a protocol the server and the simulation program against."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

import numpy as np

from fedper.common.dp.mechanism import DPReport
from fedper.common.robust_aggregate import AggregationReport
from fedper.common.secagg.fixed_point import FixedPoint

Tensors = Mapping[str, np.ndarray]
Layout = Sequence[tuple[str, tuple[int, ...]]]


class Contribution(NamedTuple):
    """One accepted update: its tensors, the examples it claims, and under DP the device's bit
    (whether its delta was within the clip before clipping)."""

    tensors: Tensors
    num_samples: int
    unclipped: bool | None = None


@dataclass(frozen=True)
class Quorum:
    """How many accepted updates a round needs to close (``min_clients``) and closes at once with
    (``target_clients``)."""

    min_clients: int
    target_clients: int


@dataclass(frozen=True)
class RoundProgress:
    """Where an open round stands when the policy is asked whether it ends: its accepted updates,
    whether its deadline passed, and for a secure round whether its unmasking is over and whether
    it has a session at all (two devices or more were drawn)."""

    received: int
    due: bool
    unmasked: bool = False
    session: bool = True


@dataclass(frozen=True)
class Decision:
    action: Literal["wait", "close", "abandon"]
    reason: str = ""


WAIT = Decision("wait")


@dataclass(frozen=True)
class UpdateRefusal:
    """Why a round does not take an update: the protocol's error code and a message for its sender."""

    code: str
    message: str


@dataclass(frozen=True)
class SecureSum:
    """What a secure round's unmasking gives: the survivors' sum of weighted deltas by tensor
    (float64, in units of the weight cap), their total weight, each flag's count, the encoding,
    and how many devices are in the sum."""

    sums: dict[str, np.ndarray]
    weight: int
    flags: list[int]
    fixed: FixedPoint
    survivors: int


@dataclass(frozen=True)
class RoundInputs:
    """Everything a mode may aggregate from. ``updates()`` is called once per pass and yields the
    same contributions in the same order each time (the server reads its stored files again
    rather than hold them). ``last_step()`` is the last published step (where centered clipping
    starts; None: none yet). ``secure`` is a secure round's unmasked sum (None: no session)."""

    layout: Layout
    base: Tensors  # float64, the round's base
    updates: Callable[[], Iterable[Contribution]] = lambda: ()
    noise: np.random.Generator | None = None  # DP's noise; the server seeds it from the OS
    last_step: Callable[[], Tensors | None] = lambda: None
    secure: SecureSum | None = None
    spill: Path | None = None  # where the coordinate clip may spill the round's updates
    group: int = 8  # updates FedAvg folds at once (1: one loaded update in memory at a time)


@dataclass(frozen=True)
class RoundResult:
    """A round's new base (float32) and what the mode did to make it."""

    base: dict[str, np.ndarray]
    updates: int
    robust: AggregationReport | None = None
    dp: DPReport | None = None
    secure: bool = False


class RoundStrategy(Protocol):
    """A round mode. ``aggregate`` returns the result, or a reason when the round publishes nothing."""

    def device_clip(self) -> float | None:
        """The L2 bound a device clips its base delta to (DP), or None."""

    def refusal(self, tensors: Tensors, base: Tensors, layout: Layout) -> UpdateRefusal | None: ...

    def needs_base(self) -> bool:
        """Whether ``refusal`` needs the round's base (float64)."""

    def decide(self, progress: RoundProgress) -> Decision: ...

    def aggregate(self, inputs: RoundInputs) -> RoundResult | str: ...

    def record(self, result: RoundResult) -> bool:
        """Keep what the next round needs from a published (or refused noised) result; False when
        no further round may run (a DP budget spent)."""

    def allows_next(self) -> bool: ...
