"""Secure rounds as a state machine (issue 49): five honest devices and one hostile one, which
sends generated messages at any stage, in any order, between restarts of the server. After every
round: it was published with the honest devices' result (exactly, when the hostile device's input
is not in the sum; within the documented bound when it is) or abandoned with a recorded reason;
no answer was a 5xx; the server's files never held an honest device's words or delta in the
clear; and the next round opens. The same with DP-FedAvg inside the secure rounds.

`make test` runs a few examples; `make test-slow` many more (the counts are printed with -s).
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fedper.common.manifest import Manifest, read_manifest
from fedper.common.protocol import ErrorCode
from fedper.common.secagg import shamir
from fedper.common.secagg.device_session import SEALED_BYTES, RequestRefusedError
from fedper.common.secagg.fixed_point import FixedPoint
from tests.support.secure_round_driver import Scene, SecureRoundDriver, b64
from tests.support.server_support import round_info

STAGES = ("keys", "shares", "masked", "unmask")
COUNTS: collections.Counter[str] = collections.Counter()  # what the examples covered, printed at the end


@lru_cache(maxsize=1)
def _export() -> tuple[Path, Manifest]:
    from fedper.export.pipeline import write_server_only_export

    path = write_server_only_export(Path(tempfile.mkdtemp(prefix="fedper-sm-")) / "artifacts", alpha=0.25)
    return path, read_manifest(path)


def _hostile_message(
    stage: str, kind: str, d: SecureRoundDriver, me: str, rng: np.random.Generator, seen: dict[str, Any]
) -> Any:
    """What the hostile device sends for ``stage``: honest, or one of the attacks of its kind."""
    honest = [x for x, _ in d.devices if x != me]
    victim = honest[int(rng.integers(len(honest)))]
    if stage == "keys":
        a = d.sessions[me].advertise()
        # Keys it could have seen: a device's it saw relayed in an earlier round, or (the door's
        # check) one that device already posted in this round; fresh keys are known to no one before.
        v = d.sessions[victim].advertise() if victim in d.advertised else seen.get(victim, a)
        return {
            "honest": None,
            "random": {"channel_key": b64(rng.bytes(32)), "mask_key": b64(rng.bytes(32))},
            "replay": {"channel_key": b64(v.channel), "mask_key": b64(v.mask)},
            "same": {"channel_key": b64(a.mask), "mask_key": b64(a.mask)},
            "low order": {"channel_key": b64(bytes(32)), "mask_key": b64(a.mask)},
            "short": {"channel_key": b64(rng.bytes(31)), "mask_key": b64(a.mask)},
        }[kind]
    if stage == "shares":
        found = d.fetch_keys(me)
        if found is None:
            return None
        try:
            sealed = d.sessions[me].share_keys(*found)
        except RequestRefusedError:
            return {}
        names = sorted(sealed)
        return {
            "honest": sealed,
            "random": {m: rng.bytes(SEALED_BYTES) for m in names},
            "some random": {m: (rng.bytes(SEALED_BYTES) if i % 2 else c) for i, (m, c) in enumerate(sealed.items())},
            "swapped": {m: sealed[names[(i + 1) % len(names)]] for i, m in enumerate(names)},
            "empty": {m: b"" for m in names},
            "missing one": dict(list(sealed.items())[1:]),
        }[kind]
    if stage == "masked":
        fixed = d.fixed()
        words = fixed.encode(np.zeros(d.secagg_words()), 50, (1,) if d.dp else ()).astype(np.int64)
        if kind == "huge weight":
            words[-1] = 2**31
        elif kind == "negative weight":
            words[-1] = -90
            words[:50] = fixed.bound
        elif kind == "clamped":
            words[:-1] = fixed.bound
        elif kind == "huge flag" and d.dp:
            words[-2] = 2**31 - 1
        elif kind == "random":
            return ("raw", rng.integers(0, 2**32, size=len(words), dtype=np.uint64).astype("<u4").tobytes())
        elif kind == "replay" and d.sent_masked:
            return ("raw", next(iter(d.sent_masked.values())))
        elif kind == "short":
            return ("raw", rng.bytes(12))
        elif kind == "complaints":
            return ("words", words.astype(np.uint32), honest)
        return ("words", words.astype(np.uint32), None)
    r = d.fetch_unmask(me)
    if r.status_code != 200:
        return None
    request = r.json()
    try:
        answer = d.sessions[me].unmask(request["dropped"], request["survivors"])
    except RequestRefusedError:
        return {}
    lie: dict[str, bytes] = {}
    for about, share in answer.items():
        s = shamir.Share.from_bytes(share)
        if kind == "shifted":
            lie[about] = shamir.Share(s.index, (s.value + 1) % shamir.PRIME).to_bytes()
        elif kind == "other index":
            lie[about] = shamir.Share(s.index % 5 + 1, s.value).to_bytes()
        elif kind == "random":
            lie[about] = shamir.Share(s.index, int(rng.integers(0, 2**62)) * 2**400).to_bytes()
        else:
            lie[about] = share
    return {"honest": answer, "missing": dict(list(answer.items())[1:])}.get(kind, lie)


KINDS = {
    "keys": ("honest", "random", "replay", "same", "low order", "short"),
    "shares": ("honest", "random", "some random", "swapped", "empty", "missing one"),
    "masked": (
        "honest",
        "random",
        "replay",
        "huge weight",
        "negative weight",
        "clamped",
        "huge flag",
        "short",
        "complaints",
    ),
    "unmask": ("honest", "shifted", "other index", "random", "missing"),
}


class SecureRounds(RuleBasedStateMachine):
    dp = False

    @initialize()
    def start(self) -> None:
        artifacts, manifest = _export()
        self.folder = Path(tempfile.mkdtemp(prefix="fedper-sm-data-"))
        more: dict[str, object] = {"enroll_per_minute": 10**6}
        if self.dp:
            more.update(dp=True, dp_noise_multiplier=0.0, dp_clip=1.0, dp_count_stddev=1.0,
                        dp_sampling_probability=1.0)  # fmt: skip
        self.scene = Scene(artifacts, manifest, self.folder / "data", **more)
        self.driver: SecureRoundDriver | None = None
        self.stage = -1  # the honest devices' next stage; -1: no round open to them
        self.version = 0
        self.dropout = ""
        self.hostile_sent: set[str] = set()
        self.rng = np.random.default_rng(0)
        self.seen: dict[str, Any] = {}  # the keys relayed to the hostile device in earlier rounds
        COUNTS["examples"] += 1

    def teardown(self) -> None:
        if hasattr(self, "scene"):
            self.scene.server.__exit__(None, None, None)
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- the round ---------------------------------------------------------------------------

    @precondition(lambda self: self.stage == -1)
    @rule(dropout=st.booleans())
    def begin(self, dropout: bool) -> None:
        if self.driver is not None:
            found = self.driver.fetch_keys(self.scene.hostile)
            self.seen = found[0] if found is not None else self.seen
        self.driver = self.scene.round()
        self.stage, self.hostile_sent, self.included = 0, set(), set()
        self.dropout = self.scene.honest[0] if dropout else ""  # leaves after sharing its keys
        COUNTS["rounds"] += 1

    @precondition(lambda self: 0 <= self.stage < len(STAGES))
    @rule()
    def honest_stage(self) -> None:
        """The honest devices' part of their next stage; then its time runs out."""
        d, scene = self.driver, self.scene
        assert d is not None
        stage = STAGES[self.stage]
        for h in scene.honest:
            if stage == "keys":
                _ok(d.post_keys(h))
            elif stage == "shares":
                with contextlib.suppress(RequestRefusedError):  # a key list it must refuse: it sits out
                    _ok(d.post_shares(h))
            elif stage == "masked":
                try:
                    if not d.fetch_shares(h):
                        continue
                except RequestRefusedError:
                    continue
                if h != self.dropout:
                    raw = d.sessions[h].masked_input(d.words(scene.deltas[h], scene.samples[h])).astype("<u4").tobytes()
                    if _ok(d.post_masked(h, raw=raw)):
                        d.sent_masked[h] = raw
            elif h != self.dropout:
                with contextlib.suppress(RequestRefusedError):
                    _ok(d.post_unmask(h))
        if stage == "masked":
            self._nothing_in_the_clear()
        d.wait_out(stage)
        if stage == "masked":  # who is in the sum is fixed from here on
            found = scene.server.state.rounds.secure.session(d.number)  # type: ignore[union-attr]
            self.included = set(found[1].included()) if found is not None else set()
        self.stage += 1

    @precondition(lambda self: self.stage >= 0)
    @rule(stage=st.sampled_from(STAGES), data=st.data())
    def hostile_sends(self, stage: str, data: st.DataObject) -> None:
        """Any stage's message, at any time, of any kind."""
        d, me = self.driver, self.scene.hostile
        assert d is not None
        kind = data.draw(st.sampled_from(KINDS[stage]), label="kind")
        message = _hostile_message(stage, kind, d, me, self.rng, self.seen)
        COUNTS[f"hostile {stage}: {kind}"] += 1
        if stage == "keys":
            r = d.post_keys(me, message)
        elif stage == "shares":
            if message is None:
                return
            r = d.post_shares(me, message)
        elif stage == "masked":
            if message[0] == "raw":
                r = d.post_masked(me, raw=message[1], unopened=[])
            else:
                r = d.post_masked(me, message[1], unopened=message[2] or [])
        else:
            if message is None:
                return
            r = d.post_unmask(me, message)
        assert r.status_code < 500, r.text
        if r.status_code == 202:
            self.hostile_sent.add(stage)
        else:
            assert r.json()["code"] and r.json()["message"], r.text

    @precondition(lambda self: self.stage >= 0)
    @rule()
    def restart(self) -> None:
        self.scene.restart()
        assert self.driver is not None
        self.driver.http = self.scene.server.http
        COUNTS["restarts"] += 1

    @precondition(lambda self: self.stage == len(STAGES))
    @rule()
    def finish(self) -> None:
        """The deadline passes; the round was published as it should be, or abandoned with a reason."""
        d, scene = self.driver, self.scene
        assert d is not None and scene.server.state is not None
        included = self.included
        d.wait_out("unmask")
        scene.tick()
        info = round_info(scene.server.http, d.number)
        assert info["state"] in ("closed", "abandoned"), info
        if info["state"] == "abandoned":
            assert info["reason"], info
            COUNTS["abandoned"] += 1
        else:
            COUNTS["published"] += 1
            self.version += 1
            self._check_published(included)
        self.stage = -1

    @invariant()
    def tasks_never_fail(self) -> None:
        if hasattr(self, "scene"):
            r = self.scene.server.http.get("/v1/status")
            assert r.status_code == 200, r.text
            if self.dp:
                clip = r.json()["privacy"]["clip_norm"]
                assert 0 < clip < float("inf")

    # --- the checks ----------------------------------------------------------------------------

    def _check_published(self, included: set[str]) -> None:
        scene, d = self.scene, self.driver
        assert d is not None
        step = scene.base(self.version) - scene.base(self.version - 1)
        honest = sorted(included & set(scene.honest))
        fixed: FixedPoint = d.fixed()
        if self.dp:  # the sum over the expected cohort; the sum projected onto B x C
            assert np.linalg.norm(step) <= fixed.clip * (1 + 1e-4)
            if scene.hostile not in included:
                expected = sum(scene.deltas[h] for h in honest) / len(scene.devices)
                assert np.max(np.abs(step - expected)) <= 1e-5
        elif scene.hostile in included:  # its words are its own: the bound, not FedAvg
            assert np.linalg.norm(step) <= fixed.clip + len(included) * fixed.error_norm(len(step)) + 1e-5
        else:
            assert np.max(np.abs(step - scene.fedavg(honest, fixed.weight_cap))) <= 1e-6

    def _nothing_in_the_clear(self) -> None:
        """No file of the server holds the start of an honest device's words or its delta."""
        scene, d = self.scene, self.driver
        assert d is not None
        needles = []
        for h in scene.honest:
            needles.append(d.words(scene.deltas[h], scene.samples[h])[:16].astype("<u4").tobytes())
            needles.append(scene.deltas[h][:8].astype("<f8").tobytes())
            needles.append(scene.deltas[h][:8].astype("<f4").tobytes())
        for path in (self.folder / "data").rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                assert not any(n in content for n in needles), path


class SecureRoundsWithDP(SecureRounds):
    dp = True


def _ok(r: Any) -> bool:
    assert r.status_code < 500, r.text
    return r.status_code == 202 or (r.status_code == 409 and r.json()["code"] == ErrorCode.DUPLICATE_UPDATE)


QUICK = settings(max_examples=int(os.environ.get("FEDPER_SM_EXAMPLES", "4")), stateful_step_count=25, deadline=None,
                 suppress_health_check=list(HealthCheck))  # fmt: skip
LONG = settings(max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))


TestSecureRounds = SecureRounds.TestCase
TestSecureRounds.settings = QUICK
TestSecureRoundsWithDP = SecureRoundsWithDP.TestCase
TestSecureRoundsWithDP.settings = QUICK


class SecureRoundsLong(SecureRounds):
    pass


class SecureRoundsWithDPLong(SecureRoundsWithDP):
    pass


TestSecureRoundsLong = pytest.mark.slow(SecureRoundsLong.TestCase)
TestSecureRoundsLong.settings = LONG
TestSecureRoundsWithDPLong = pytest.mark.slow(SecureRoundsWithDPLong.TestCase)
TestSecureRoundsWithDPLong.settings = LONG


def teardown_module() -> None:
    print(f"\nsecure round state machines: {dict(sorted(COUNTS.items()))}")
