"""Generated requests against the whole application (in process, through its ASGI stack):
whatever a client sends, the answer is a JSON 4xx with a code, never a 5xx, and a refused
request changes nothing; whatever is accepted, the loader of stored updates can read."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper.common.manifest import read_manifest
from fedper.server.app import create_app
from fedper.server.config import ServerConfig
from fedper.server.state import ServerState, open_state
from tests.support.server_support import ADMIN, ENROLL, base_like, update_body

STALE = 7  # the fuzzed device's valid body claims this base version; round 1 trains version 0
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Fuzzed:
    def __init__(self, client: TestClient, state: ServerState, data: Path, device: dict[str, str], body: bytes):
        self.client, self.state, self.data = client, state, data
        self.device = device  # holds a slot of round 1; its valid body is stale: any valid upload is a 409
        self.valid_body = body

    def fingerprint(self) -> tuple[Any, ...]:
        files = sorted(str(p.relative_to(self.data)) for d in ("tmp", "updates", "quarantine")
                       for p in (self.data / d).rglob("*"))  # fmt: skip
        return self.state.rounds.snapshot, self.state.db.devices.count(), files

    def check(self, response: Any, allowed: set[int]) -> None:
        assert response.status_code < 500, (response.status_code, response.text[:300])
        assert response.status_code in allowed, (response.status_code, response.text[:300])
        if response.status_code >= 400:
            body = response.json()
            assert isinstance(body["code"], str) and body["code"] and body["message"], body


@pytest.fixture(scope="module")
def fuzzed(server_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDPER_ADMIN_TOKEN", ADMIN)
    mp.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)
    config = ServerConfig(artifacts=server_artifacts, data_dir=data, target_clients=1000, round_timeout=0,
                          enroll_per_minute=10**6, auth_failures_per_minute=10**6)  # fmt: skip
    state = open_state(config)
    with TestClient(create_app(config, state), raise_server_exceptions=False) as client:
        r = client.post("/v1/devices", json={"enrollment_key": ENROLL})
        device = {"Authorization": f"Bearer {r.json()['token']}"}
        body = update_body(base_like(read_manifest(server_artifacts)), base_version=STALE)
        assert client.get("/v1/task", headers=device).status_code == 200  # a slot in round 1's cohort
        r = client.post("/v1/rounds/1/updates", content=body, headers=device)
        assert r.json()["code"] == "stale_base_version"  # answered after every check of the body
        yield Fuzzed(client, state, data, device, body)
    mp.undo()


# --- values a hostile JSON header may hold --------------------------------------------------

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63 - 5, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["F32", "F16", "I64", "BOOL", "\ud800", "x" * 300]),
)  # fmt: skip
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=12)  # fmt: skip


def _split(body: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", body[:8])
    return json.loads(body[8 : 8 + n]), body[8 + n :]


def _encode(header_text: str, data: bytes) -> bytes:
    raw = header_text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw + data


def _zero(value: object) -> bool:
    """Whether the server could read ``value`` as base version 0 (round 1's)."""
    try:
        return int(str(value).strip()) == 0
    except ValueError:
        return False


@st.composite
def mutated_uploads(draw: st.DrawFn, valid: bytes) -> bytes:
    header, data = _split(valid)
    names = [k for k in header if k != "__metadata__"]
    kind = draw(st.sampled_from(["field", "extra", "drop", "metadata", "data", "text", "length"]))
    if kind == "field":
        name = draw(st.sampled_from(names))
        header[name][draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(json_value)
    elif kind == "extra":
        target = header[draw(st.sampled_from(names))] if draw(st.booleans()) else header
        target[draw(st.text(max_size=12))] = draw(json_value)
    elif kind == "drop":
        del header[draw(st.sampled_from(names))]
    elif kind == "metadata":
        key = draw(st.sampled_from(["num_samples", "base_version", "metric.accuracy", "metric.X"]) | st.text())
        # any base version but the round's: a body valid in every other way is a 409, not a 202
        header["__metadata__"][key] = draw(json_value.filter(lambda v: key != "base_version" or not _zero(v)))
    elif kind == "data":
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=64))
    text = json.dumps(header, ensure_ascii=draw(st.booleans()))
    if kind == "text":  # textual damage a dict cannot express: duplicates, nesting, raw tokens
        fragment = draw(st.sampled_from(['"__metadata__": {}, ', "[" * 5000 + "]" * 5000 + ", ", "NaN, ",
                                         '"a": 1' + "0" * 5000 + ", ", '"\\ud800": 1, ', "\x00"]))  # fmt: skip
        position = draw(st.integers(1, len(text) - 1))
        text = text[:position] + fragment + text[position:]
    body = _encode(text, data)
    if kind == "length":
        body = struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + body[8:]
    return body


@given(data=st.data())
@FUZZ
def test_mutated_uploads_are_refused_without_a_trace(fuzzed: Fuzzed, data: st.DataObject) -> None:
    body = data.draw(mutated_uploads(fuzzed.valid_body))
    before = fuzzed.fingerprint()
    r = fuzzed.client.post("/v1/rounds/1/updates", content=body, headers=fuzzed.device)
    fuzzed.check(r, {400, 409, 422})
    assert fuzzed.fingerprint() == before


@given(body=st.binary(max_size=4096) | st.builds(lambda n, b: struct.pack("<Q", n) + b,
                                                st.integers(0, 4096), st.binary(max_size=4096)))  # fmt: skip
@FUZZ
def test_arbitrary_bytes_are_refused_without_a_trace(fuzzed: Fuzzed, body: bytes) -> None:
    before = fuzzed.fingerprint()
    r = fuzzed.client.post("/v1/rounds/1/updates", content=body, headers=fuzzed.device)
    fuzzed.check(r, {400})
    assert fuzzed.fingerprint() == before


@given(body=st.one_of(
    json_value.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass")),
    st.dictionaries(st.sampled_from(["enrollment_key", "platform", "attestation", "x"]), json_value).map(
        lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
))  # fmt: skip
@FUZZ
def test_enrollment_bodies(fuzzed: Fuzzed, body: bytes) -> None:
    before = fuzzed.fingerprint()
    r = fuzzed.client.post("/v1/devices", content=body)
    fuzzed.check(r, {400, 401})
    assert fuzzed.fingerprint() == before


@given(body=st.one_of(
    json_value.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass")),
    st.dictionaries(st.sampled_from(["count", "platform", "x"]), st.one_of(json_value, st.integers(-5, 10_005))).map(
        lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
))  # fmt: skip
@FUZZ
def test_provisioning_bodies(fuzzed: Fuzzed, body: bytes) -> None:
    """Revision 1.8's bulk enrollment and challenge: a refused body changes nothing; an accepted
    provisioning adds exactly the devices it answers with, each token working."""
    before = fuzzed.fingerprint()
    r = fuzzed.client.post("/v1/devices/challenge", content=body)
    fuzzed.check(r, {400, 401, 404})  # 404: this server has no --attestation
    assert fuzzed.fingerprint() == before
    r = fuzzed.client.post("/v1/admin/devices", content=body, headers={"Authorization": f"Bearer {ADMIN}"})
    fuzzed.check(r, {201, 400})
    if r.status_code == 400:
        assert fuzzed.fingerprint() == before
        return
    devices = r.json()["devices"]
    assert 1 <= len(devices) == json.loads(body)["count"] <= 10_000
    assert fuzzed.state.db.devices.count() == before[1] + len(devices)
    token = {"Authorization": f"Bearer {devices[-1]['token']}"}
    assert fuzzed.client.get("/v1/task", headers=token).status_code in {200, 204}


segment = st.one_of(
    st.integers(-(2**70), 2**70).map(str), st.text(max_size=30), st.sampled_from(["..", "%2e%2e", "%ED%A0%80", ""])
)
ROUTES = ["/v1/models/{}/base", "/v1/artifacts/{}", "/v1/rounds/{}", "/v1/rounds/{}/updates",
          "/v1/admin/devices/{}/revoke", "/v1/devices/{}", "/v1/{}", "/{}"]  # fmt: skip


@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
    route=st.sampled_from(ROUTES),
    part=segment,
    query=st.text(max_size=20),
    auth=st.sampled_from(["device", "admin", "none", "garbage"]),
    headers=st.dictionaries(st.sampled_from(["If-None-Match", "Content-Type", "X-Forwarded-For", "Content-Length"]),
                            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)),
)  # fmt: skip
@FUZZ
def test_any_path_method_and_header(fuzzed: Fuzzed, method, route, part, query, auth, headers) -> None:
    if auth == "admin" and method == "POST":
        return  # operator actions (stop, revoke) change state by design
    sent = {**headers, **({"device": fuzzed.device, "admin": {"Authorization": f"Bearer {ADMIN}"},
                           "garbage": {"Authorization": "Bearer \x7f junk"}}.get(auth, {}))}  # fmt: skip
    sent.pop("Content-Length", None)  # the client computes it; a wrong one is the HTTP layer's to refuse
    before = fuzzed.fingerprint()
    path = route.format(quote(part, safe="%.")) + (f"?{quote(query, safe='=&')}" if query else "")
    r = fuzzed.client.request(method, path, headers=sent)
    assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
    if r.status_code >= 400 and method != "HEAD":
        assert r.json()["code"], r.text
    assert fuzzed.fingerprint() == before


@given(
    dtype=st.sampled_from([np.float32, np.float16]),
    metrics=st.dictionaries(  # names that revision 1.4 bounds to their meaning (accuracy, loss) left out
        st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True).filter(lambda n: "accuracy" not in n and "loss" not in n),
        st.floats(-1e9, 1e9, allow_nan=False),
        max_size=16,
    ),
    num_samples=st.integers(1, 100000),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whatever_is_accepted_loads_back(fuzzed: Fuzzed, dtype, metrics, num_samples) -> None:
    r = fuzzed.client.post("/v1/devices", json={"enrollment_key": ENROLL, "platform": "fuzz"})
    device = {"Authorization": f"Bearer {r.json()['token']}"}
    manifest = fuzzed.state.manifest
    body = update_body(base_like(manifest, seed=num_samples), num_samples, 0, metrics, dtype=dtype)
    assert fuzzed.client.get("/v1/task", headers=device).status_code == 200
    r = fuzzed.client.post("/v1/rounds/1/updates", content=body, headers=device)
    fuzzed.check(r, {202})
    for update in fuzzed.state.db.rounds.updates(1):
        assert update.file is not None
        fuzzed.state.rounds.store.load(update.file)  # the loader used at restart


def test_a_fault_of_the_server_is_a_json_500_with_a_logged_request_id(
    fuzzed: Fuzzed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> int:
        raise RuntimeError("database gone")

    monkeypatch.setattr(fuzzed.state.db.devices, "count", broken)
    with caplog.at_level("ERROR", logger="fedper.server"):
        r = fuzzed.client.get("/v1/status")
    assert r.status_code == 500
    body = r.json()
    assert body["code"] == "internal_error" and len(body["request_id"]) == 16
    logged = [rec for rec in caplog.records if body["request_id"] in rec.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # the traceback, once
