"""A fleet's emulated faults around a device's round, without a server: what happens between the
round's phases, and which rounds fail for a given seed."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from fedper.device_runtime.client import ProtocolClient
from fedper.device_runtime.device import Device, DeviceOptions
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.emulation import Faults, FlakyTransport
from fedper.device_runtime.events import Dropped, RoundReport


def _task(number: int) -> Any:
    return SimpleNamespace(round=number, model_version=number - 1)


def _scored(task: Any) -> Any:
    """What ``evaluate`` returns here."""
    return SimpleNamespace(task=task, accuracy=0.5, client=SimpleNamespace(num_samples=7))


def _device(tmp_path: Path, faults: Faults, client_id: int = 0, seed: int = 0) -> tuple[Device, list[Any]]:
    """An emulated device whose phases only log that they ran (and its waits and events)."""
    log: list[Any] = []
    options = DeviceOptions(engine="eager", seed=seed, client_id=client_id)
    device = Device(None, DeviceStorage(tmp_path), lambda _m: None, options, "key", log.append,  # type: ignore[arg-type, return-value]
                    sleep=lambda s: log.append(("sleep", s)), plan=faults)  # fmt: skip

    def phase(name: str, result: Any) -> Any:
        log.append(name)
        return result

    vars(device).update(evaluate=lambda task: phase("evaluate", _scored(task)), train=lambda scored: phase("train", scored),
                        send=lambda _trained: phase("send", "sent"))  # fmt: skip
    return device, log


def test_a_device_without_faults_runs_its_round_as_a_board_does(tmp_path: Path) -> None:
    device, log = _device(tmp_path, Faults())
    assert device.run_round(_task(1)) == "sent"  # type: ignore[comparison-overlap]
    assert log == ["evaluate", "train", "send"]


def test_a_dropping_device_evaluates_then_quits_and_skips_the_round(tmp_path: Path) -> None:
    device, log = _device(tmp_path, Faults(dropout=1.0, straggler=1.0, straggler_delay=3.0))
    report = device.run_round(_task(4))
    assert report == RoundReport(4, 3, 7, 0.5, None, None, False, None)
    assert log == ["evaluate", Dropped(4)]
    assert device._skip_round == 4  # asks again only for the next round


def test_a_straggler_waits_between_training_and_sending(tmp_path: Path) -> None:
    device, log = _device(tmp_path, Faults(straggler=1.0, straggler_delay=3.0))
    device.run_round(_task(1))
    assert log == ["evaluate", "train", ("sleep", 3.0), "send"]


def _dropped(tmp_path: Path, seed: int, client_id: int, rounds: range) -> list[int]:
    device, log = _device(tmp_path / f"{seed}-{client_id}", Faults(dropout=0.3), client_id, seed)
    for number in rounds:
        device.run_round(_task(number))
    return [event.round for event in log if isinstance(event, Dropped)]


@pytest.mark.parametrize(
    ("seed", "client_id", "expected"), [(0, 0, [1, 3, 4, 7]), (0, 3, [3, 4, 9]), (7, 1, [3, 6, 7, 8])]
)
def test_the_same_seed_drops_the_same_devices_in_the_same_rounds(
    tmp_path: Path, seed: int, client_id: int, expected: list[int]
) -> None:
    """Drawn from (seed, client id, round): a rerun fails the same rounds, whatever ran before."""
    assert _dropped(tmp_path, seed, client_id, range(1, 11)) == expected
    assert _dropped(tmp_path / "again", seed, client_id, range(1, 11)) == expected
    assert _dropped(tmp_path / "later", seed, client_id, range(5, 11)) == [n for n in expected if n >= 5]


def _outcomes(seed: int, requests: int = 400) -> list[bool]:
    """Whether each of ``requests`` GETs through a 25 % flaky network got through."""
    flaky = FlakyTransport(0.25, seed, inner=httpx.MockTransport(lambda _r: httpx.Response(204)))
    got: list[bool] = []
    with httpx.Client(transport=flaky, base_url="http://server") as http:
        for _ in range(requests):
            try:
                http.get("/v1/task")
                got.append(True)
            except httpx.ConnectError:
                got.append(False)
    return got


def test_a_flaky_network_fails_requests_at_its_rate_the_same_ones_for_the_same_seed() -> None:
    first = _outcomes(1)
    assert first == _outcomes(1) and first != _outcomes(2)
    assert 0.18 < first.count(False) / len(first) < 0.32  # 0.25 +- 4.6 standard deviations


def test_the_device_client_retries_what_a_flaky_network_lost() -> None:
    served: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        served.append(request.url.path)
        return httpx.Response(200, content=b"base", headers={"ETag": '"v1"'})

    waits: list[float] = []
    flaky = FlakyTransport(0.5, seed=0, inner=httpx.MockTransport(server))
    client = ProtocolClient("http://server", transport=flaky, rng=random.Random(0), sleep=waits.append)
    try:
        assert [client.download("/v1/models/1/base") for _ in range(5)] == [(b"base", '"v1"')] * 5
    finally:
        client.close()
    assert served == ["/v1/models/1/base"] * 5  # a lost request never reached the server
    assert waits  # some were lost (seed 0), each retried after a backoff wait, not a wall-clock one
