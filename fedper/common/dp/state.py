"""What a DP-FedAvg run keeps between rounds: the clip the next round uses, the noised rounds
counted against the budget, and the delta fixed by the first noised round."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DPState:
    clip: float | None = None  # None: the configured first clip
    rounds: int = 0
    delta: float | None = None  # None: not fixed yet
