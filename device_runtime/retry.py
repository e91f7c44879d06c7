"""Exponential backoff with full jitter, for network errors and 5xx answers."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx

from fedper.common.errors import FedperError

T = TypeVar("T")


class TransientError(FedperError):
    """A failure worth retrying (connection trouble, a 5xx)."""


@dataclass(frozen=True)
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    attempts: int = 8

    def delays(self, rng: random.Random) -> list[float]:
        return [rng.uniform(0, min(self.cap, self.base * 2**i)) for i in range(self.attempts - 1)]


def with_retries(
    call: Callable[[], T],
    backoff: Backoff,
    rng: random.Random,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call``; on a transient failure wait and try again, up to ``backoff.attempts``."""
    last: Exception | None = None
    for delay in [*backoff.delays(rng), None]:
        try:
            return call()
        except (httpx.TransportError, TransientError) as exc:
            last = exc
            if delay is None:
                break
            sleep(delay)
    raise TransientError(f"gave up after {backoff.attempts} attempts: {last}") from last
