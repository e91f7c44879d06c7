"""What an emulated fleet adds to a device (``fedper fleet --dropout --straggler --flaky-network``):
devices that quit mid-round, upload late, or lose requests. Wrappers around what a board runs
(:class:`~device_runtime.device.Device`'s round plan, its httpx transport), composed by the fleet's hosts
(:mod:`device_runtime.device_host`); ``fedper device`` never imports this module.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from fedper.common.protocol import Task
from fedper.device_runtime.device import Device
from fedper.device_runtime.events import Dropped, RoundReport


@dataclass(frozen=True)
class Faults:
    """A round plan (:class:`~device_runtime.device.RoundPlan`) whose rounds fail: the device quits
    after evaluating with probability ``dropout``, or waits ``straggler_delay`` seconds between
    training and sending with probability ``straggler``. Each round's draws come from a generator
    seeded by (seed, client id, round): a fleet run again with the same seed drops and delays the
    same devices in the same rounds."""

    dropout: float = 0.0
    straggler: float = 0.0
    straggler_delay: float = 0.0

    def __call__(self, device: Device, task: Task) -> RoundReport:
        rng = random.Random(hash((device.options.seed, device.options.client_id, task.round)))
        scored = device.evaluate(task)
        if rng.random() < self.dropout:
            device.emit(Dropped(task.round))
            return device.give_up(scored)
        trained = device.train(scored)
        if rng.random() < self.straggler:
            device.sleep(self.straggler_delay)
        return device.send(trained)


class FlakyTransport(httpx.BaseTransport):
    """Fails a request with a connection error with probability ``p`` (before sending it)."""

    def __init__(self, p: float, seed: int, inner: httpx.BaseTransport | None = None):
        self.p = p
        self._rng = random.Random(seed)
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._rng.random() < self.p:
            raise httpx.ConnectError("simulated network failure", request=request)
        return self._inner.handle_request(request)
