"""The places for upload bodies in flight (``--max-inflight-uploads``), kept so that devices
trickling their bodies cannot hold them against the others.

Each device holds at most one place (``409 upload_in_progress``). When every place is taken and
another device asks, each upload past its ``--upload-rate-grace`` that averages below
``--busy-upload-rate`` is cut (``408 upload_timeout``, the reason in its message), and its device
may not take a place again in that round (``503 server_busy``): a trickling device holds a place
for its grace period at most once a round, whatever it does, while an honest upload (hundreds of
kB/s) is never cut. The newcomer is told to come back in a second (``503``, ``Retry-After: 1``),
when the cut places are free. Only touched on the event loop: no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from fedper.server.refusals import ServerBusyError, UploadInProgressError


@dataclass
class Place:
    """One upload in flight: how much of its body has arrived since when, and its deadline."""

    device: str
    started: float  # the event loop's time
    received: int = 0
    deadline: asyncio.Timeout | None = None
    cut: bool = False

    def rate(self, now: float) -> float:
        return self.received / max(now - self.started, 1e-9)


@dataclass
class UploadPlaces:
    limit: int
    busy_rate: float  # bytes per second an upload must average, past its grace, while others wait
    grace: float
    retry_after: int
    places: dict[str, Place] = field(default_factory=dict)
    _barred: tuple[int, set[str]] = field(default_factory=lambda: (0, set()))  # a round, its devices cut as slow

    def __len__(self) -> int:
        return len(self.places)

    @contextlib.contextmanager
    def take(self, device: str, round_number: int) -> Iterator[Place]:
        """The device's place while its body arrives (the refusals above when it gets none)."""
        if device in self.places:
            raise UploadInProgressError("this device is already sending an update; wait for its answer")
        if self._barred[0] != round_number:
            self._barred = (round_number, set())
        if device in self._barred[1]:
            message = (f"this device's upload of round {round_number} was cut for being too slow while other "
                       "devices waited; it may upload in the next round")  # fmt: skip
            raise ServerBusyError(message, self.retry_after)
        now = asyncio.get_running_loop().time()
        if len(self.places) >= self.limit:
            cut = self._cut_slow(now)
            wait = 1 if cut else self.retry_after
            raise ServerBusyError("the server is receiving as many uploads as it can; retry later", wait)
        place = Place(device, now)
        self.places[device] = place
        try:
            yield place
        finally:
            del self.places[device]

    def _cut_slow(self, now: float) -> int:
        """Cut every upload past its grace that averages below the busy rate; how many."""
        if not self.busy_rate:
            return 0
        cut = 0
        for place in self.places.values():
            if place.cut or now - place.started <= self.grace or place.rate(now) >= self.busy_rate:
                continue
            place.cut = True
            self._barred[1].add(place.device)
            if place.deadline is not None:
                place.deadline.reschedule(now)  # its reader raises TimeoutError at once: 408
            cut += 1
        return cut
