"""The server's clock: wall-clock time (deadlines are stored as such, to survive a restart)
that advances with the monotonic clock while the process runs.

An NTP step or an operator's ``date -s`` during a run moves ``time.time`` by any amount; a
deadline computed from it could then pass at once (a +2 day jump would abandon or close every
open round, discarding accepted work) or never. Read once at start, the wall clock only
places the run in calendar time.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SteadyClock:
    """``wall()`` read once, then moved forward by ``monotonic()``; called like ``time.time``."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self._monotonic = monotonic
        self._origin = wall() - monotonic()

    def __call__(self) -> float:
        return self._origin + self._monotonic()


def iso_time(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
