"""A secure round over the server's real routes (in process, on a test's clock), stage by stage,
with every device's message in the test's hands: honest ones from the protocol's own device
sessions, or whatever a hostile device sends instead."""

from __future__ import annotations

import base64
import calendar
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fedper.common import weights
from fedper.common.manifest import Manifest
from fedper.common.protocol import ErrorCode, Header
from fedper.common.secagg.device_session import Advertisement, DeviceSession
from fedper.common.secagg.fixed_point import FixedPoint
from tests.support.server_support import FakeClock, InProcessServer, admin, enroll, round_info

CAN = {Header.CAPABILITIES: Header.SECAGG}
WINDOW, STAGE, TIMEOUT = 5, 10, 120
N = 6  # k = 5 (everyone), t = 3: one hostile device and one dropout leave every secret 4 holders


def options(**more: object) -> dict[str, object]:
    return {"secagg": True, "checkin_window": WINDOW, "secagg_stage_timeout": STAGE, "round_timeout": TIMEOUT,
            "cohort_size": N, "over_selection": 1.0, "target_clients": N, "min_clients": 2,
            "secagg_neighbours": N - 1, "secagg_threshold": 3, **more}  # fmt: skip


class Scene:
    """A secure server with N enrolled devices, the last one hostile, honest deltas of norm 0.5 C."""

    def __init__(self, artifacts: Path, manifest: Manifest, data: Path, **more: object) -> None:
        self.clock = FakeClock()
        self.artifacts, self.data, self.options = artifacts, data, options(**more)
        self.server = InProcessServer(artifacts, data, clock=self.clock, **self.options).__enter__()
        self.devices = [enroll(self.server.http) for _ in range(N)]
        self.hostile = self.devices[-1][0]
        self.honest = [d for d, _ in self.devices[:-1]]
        self.words = sum(int(np.prod(shape)) for _, shape in manifest.layout("base"))
        self.manifest = manifest
        rng = np.random.default_rng(7)
        self.deltas = {
            d: (lambda v: v * (0.5 / np.linalg.norm(v)))(rng.normal(size=self.words)) for d, _ in self.devices
        }
        self.samples = {d: int(rng.integers(20, 200)) for d, _ in self.devices}

    def round(self) -> SecureRoundDriver:
        driver = SecureRoundDriver(self.server.http, self.clock, self.devices, WINDOW, floats=self.words)
        driver.begin()
        return driver

    def tick(self) -> None:
        assert self.server.state is not None
        self.server.state.rounds.tick()

    def restart(self) -> None:
        self.server.__exit__(None, None, None)
        self.server = InProcessServer(self.artifacts, self.data, clock=self.clock, **self.options).__enter__()

    def base(self, version: int) -> np.ndarray:
        r = self.server.http.get(f"/v1/models/{version}/base", headers=admin())
        assert r.status_code == 200, r.text
        tensors = weights.decode(r.content, f"version {version}")
        return np.concatenate([tensors[n].astype(np.float64).ravel() for n in self.manifest.base_names])

    def fedavg(self, devices: list[str], cap: int = 1000) -> np.ndarray:
        w = {d: min(self.samples[d], cap) for d in devices}
        return sum(w[d] * self.deltas[d] for d in devices) / sum(w.values())

    def assert_published(self, number: int, version: int, devices: list[str]) -> None:
        """Round ``number`` closed into ``version``: the previous one plus the FedAvg of ``devices``."""
        info = round_info(self.server.http, number)
        assert info["state"] == "closed", info
        before, after = self.base(version - 1), self.base(version)
        expected = before + self.fedavg(devices)
        assert np.max(np.abs(after - expected)) <= 1e-6

    def assert_abandoned(self, number: int, reason: str) -> None:
        info = round_info(self.server.http, number)
        assert info["state"] == "abandoned" and reason in (info["reason"] or ""), info

    def next_round_publishes(self, version: int) -> None:
        """The next round opens on ``version`` and closes with every honest device."""
        driver = self.round()
        assert self.server.http.get("/v1/task", headers=self.devices[0][1]).status_code in (200, 204, 403)
        driver.honest_round(self.honest, self.deltas, self.samples)
        driver.wait_out("unmask")
        self.tick()
        self.assert_published(driver.number, version + 1, self.honest)


OCTETS = {"Content-Type": "application/octet-stream"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class SecureRoundDriver:
    """One round: ``http`` is the server's client (replaced after a restart), ``devices`` (id,
    headers) the cohort, ``window`` the server's check-in window."""

    http: Any
    clock: Any
    devices: list[tuple[str, dict[str, str]]]
    window: float
    number: int = 0
    secagg: dict[str, Any] = field(default_factory=dict)
    dp: dict[str, Any] | None = None
    sessions: dict[str, DeviceSession] = field(default_factory=dict)
    floats: int = 0  # the base's floats (m): a masked input is m + flags + 1 words
    sent_masked: dict[str, bytes] = field(default_factory=dict)  # the masked inputs honest devices sent
    advertised: set[str] = field(default_factory=set)  # devices whose keys the server took

    @property
    def headers(self) -> dict[str, dict[str, str]]:
        return dict(self.devices)

    def begin(self) -> None:
        """Every device checks in; the window ends; every device gets its task and a session."""
        for _, headers in self.devices:
            assert self.http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
        self.clock.now += self.window
        tasks = {}
        for device, headers in self.devices:
            r = self.http.get("/v1/task", headers={**headers, **CAN})
            assert r.status_code == 200, r.text
            tasks[device] = r.json()
        task = next(iter(tasks.values()))
        self.number, self.secagg, self.dp = task["round"], task["secagg"], task.get("dp")
        self.sessions = {d: DeviceSession(d, self.secagg["session"].encode()) for d, _ in self.devices}

    def route(self, stage: str) -> str:
        return f"/v1/rounds/{self.number}/secagg/{stage}"

    def fixed(self) -> FixedPoint:
        return FixedPoint(self.secagg["clip_norm"], self.secagg["cohort"], self.secagg["weight_cap"],
                          1 if self.dp else 0)  # fmt: skip

    # --- what a device sends (honest unless given) -------------------------------------------

    def post_keys(self, device: str, body: dict[str, Any] | None = None) -> httpx.Response:
        if body is None:
            a = self.sessions[device].advertise()
            body = {"channel_key": b64(a.channel), "mask_key": b64(a.mask)}
        r = self.http.post(self.route("keys"), headers=self.headers[device], json=body)
        if r.status_code == 202:
            self.advertised.add(device)
        return r

    def fetch_keys(self, device: str) -> tuple[dict[str, Advertisement], int] | None:
        r = self.http.get(self.route("keys"), headers=self.headers[device])
        if r.status_code != 200:
            return None
        body = r.json()
        ads = {m: Advertisement(base64.b64decode(k["channel_key"]), base64.b64decode(k["mask_key"]))
               for m, k in body["neighbours"].items()}  # fmt: skip
        return ads, int(body["threshold"])

    def honest_shares(self, device: str) -> dict[str, bytes]:
        found = self.fetch_keys(device)
        assert found is not None, f"{device} got no keys"
        return self.sessions[device].share_keys(*found)

    def post_shares(self, device: str, sealed: dict[str, bytes] | None = None) -> httpx.Response:
        sealed = self.honest_shares(device) if sealed is None else sealed
        return self.http.post(self.route("shares"), headers=self.headers[device],
                              json={"shares": {m: b64(c) for m, c in sealed.items()}})  # fmt: skip

    def fetch_shares(self, device: str) -> bool:
        """The device takes the shares relayed to it (False: the server relays none to it)."""
        r = self.http.get(self.route("shares"), headers=self.headers[device])
        if r.status_code != 200:
            return False
        self.sessions[device].receive_shares({m: base64.b64decode(c) for m, c in r.json()["shares"].items()})
        return True

    def secagg_words(self) -> int:
        return self.floats

    def words(self, delta: np.ndarray, samples: int, unclipped: int = 1) -> np.ndarray:
        return self.fixed().encode(delta, samples, (unclipped,) if self.dp else ())

    def post_masked(
        self, device: str, words: np.ndarray | None = None, raw: bytes | None = None, unopened: list[str] | None = None
    ) -> httpx.Response:
        """The device's masked input: ``words`` masked by its session, or ``raw`` bytes as they are."""
        if raw is None:
            assert words is not None
            raw = self.sessions[device].masked_input(words).astype("<u4").tobytes()
        unopened = getattr(self.sessions[device], "unopened", []) if unopened is None else unopened
        extra = {Header.SECAGG_UNOPENED: ",".join(unopened)} if unopened else {}
        return self.http.post(self.route("masked"), headers={**self.headers[device], **OCTETS, **extra}, content=raw)

    def fetch_unmask(self, device: str) -> httpx.Response:
        return self.http.get(self.route("unmask"), headers=self.headers[device])

    def post_unmask(self, device: str, shares: dict[str, bytes] | None = None) -> httpx.Response:
        """The device's answer: honest (its session's, for the request it fetches) unless given."""
        if shares is None:
            r = self.fetch_unmask(device)
            if r.status_code != 200:
                return r
            shares = self.sessions[device].unmask(r.json()["dropped"], r.json()["survivors"])
        return self.http.post(self.route("unmask"), headers=self.headers[device],
                              json={"shares": {m: b64(v) for m, v in shares.items()}})  # fmt: skip

    # --- time ------------------------------------------------------------------------------

    def stage_end(self, stage: str) -> float:
        """When the stage ends at the latest: the task's deadline for it (whole seconds, UTC)."""
        when = self.secagg[f"{stage}_by"]
        return calendar.timegm(time.strptime(when, "%Y-%m-%dT%H:%M:%SZ"))

    def wait_out(self, stage: str) -> None:
        """Let the stage's time run out (those who did not send by then are out of it)."""
        self.clock.now = max(self.clock.now, self.stage_end(stage) + 1)

    def honest_round(self, honest: list[str], deltas: dict[str, np.ndarray], samples: dict[str, int],
                     dropped: frozenset[str] = frozenset()) -> None:  # fmt: skip
        """The honest devices' part of every stage (what one already sent is a duplicate), waiting
        out each stage for the others; ``dropped`` leave after sharing their keys."""
        for d in honest:
            _done(self.post_keys(d))
        self.wait_out("keys")
        for d in honest:
            _done(self.post_shares(d))
        self.wait_out("shares")
        for d in honest:
            self.fetch_shares(d)
        for d in honest:
            if d not in dropped:
                _done(self.post_masked(d, self.words(deltas[d], samples[d])))
        self.wait_out("masked")
        for d in honest:
            if d not in dropped:
                r = self.post_unmask(d)
                assert r.status_code == 202 or r.json()["code"] == ErrorCode.SECAGG_STAGE_CLOSED, r.text


def _done(r: httpx.Response) -> None:
    assert r.status_code == 202 or r.json()["code"] == ErrorCode.DUPLICATE_UPDATE, r.text
