"""What an emulated fleet adds to a device (``fedper fleet --dropout --straggler --flaky-network``):
devices that quit mid-round, upload late, or lose requests. Wrappers around what a board runs
(:class:`~device_runtime.device.Device`, its httpx transport), composed by the fleet's hosts
(:mod:`device_runtime.device_host`); ``fedper device`` never imports this module.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from fedper.common.manifest import Manifest
from fedper.common.protocol import Task
from fedper.device_runtime.client import ProtocolClient
from fedper.device_runtime.device import Device, DeviceOptions, TrainerFactory
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.events import Dropped, Event, RoundReport
from fedper.device_runtime.local_data import LocalData


@dataclass(frozen=True)
class Faults:
    dropout: float = 0.0  # chance per round of quitting mid-round (after evaluating)
    straggler: float = 0.0  # chance per round of waiting ``straggler_delay`` before uploading
    straggler_delay: float = 0.0


class EmulatedDevice(Device):
    """A device whose rounds fail as ``faults`` says. Each round's draws come from a generator
    seeded by (seed, client id, round): a fleet run again with the same seed drops and delays
    the same devices in the same rounds."""

    def __init__(
        self,
        client: ProtocolClient,
        storage: DeviceStorage,
        data: Callable[[Manifest], LocalData],
        options: DeviceOptions,
        enrollment_key: str,
        faults: Faults,
        on_event: Event | None = None,
        compute_lock: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        trainer_for: TrainerFactory | None = None,
    ):
        super().__init__(client, storage, data, options, enrollment_key, on_event, compute_lock, sleep, trainer_for)
        self.faults = faults

    def run_round(self, task: Task) -> RoundReport:
        rng = random.Random(hash((self.options.seed, self.options.client_id, task.round)))
        scored = self._evaluate(task)
        if rng.random() < self.faults.dropout:
            self._skip_round = task.round
            self._emit(Dropped(task.round))
            return RoundReport(task.round, task.model_version, scored.client.num_samples, scored.accuracy,
                               None, None, False, None)  # fmt: skip
        trained = self._train(scored)
        if rng.random() < self.faults.straggler:
            self._sleep(self.faults.straggler_delay)
        return self._send(trained)


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
