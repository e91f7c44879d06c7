"""A secure round end to end (docs/SECAGG.md): a real ``fedper serve --secagg`` process and 20
Python devices training the exported program, 3 of which drop after sharing their keys, every
request passing through a recording proxy."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedper.client_round import Client
from fedper.common import weights
from fedper.common.manifest import read_manifest
from fedper.common.protocol import ErrorCode
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.data import DataConfig
from fedper.device_runtime.client import ProtocolClient
from fedper.device_runtime.device import Device, DeviceOptions
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.emulation import Faults
from fedper.device_runtime.local_data import share
from fedper.device_runtime.secure_round import SecureRound
from tests.support.recording_proxy import Exchange, RecordingProxy
from tests.support.recording_transport import RecordingTransport
from tests.support.server_support import ENROLL, admin, serve

DEVICES, DROPPING = 20, 3
DATA = DataConfig(dataset="digits", partition="iid", num_clients=DEVICES, seed=0)
# The masked stage waits for the devices that dropped until one stage before the deadline: 60 s
# leaves it 48 s after the round opens, against about 14 s that the last of 20 devices took to
# train and send its masked input here. Two CI runs counted 16 survivors instead of 17: the
# server's session cache, rebuilt outside the rounds' lock, could drop a device's accepted keys
# (fixed in server/secure_round.py; test_server_secagg holds a reader to show it).
SERVER = {"rounds": 1, "target_clients": DEVICES, "cohort_size": DEVICES, "over_selection": 1.0, "min_clients": 2,
          "local_epochs": 1, "retry_after": 1, "secagg": True, "checkin_window": 5, "secagg_stage_timeout": 12,
          "round_timeout": 60, "start_devices": DEVICES}  # fmt: skip


def _flat(tensors: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([tensors[n].astype(np.float64).ravel() for n in names])


@pytest.mark.slow
def test_twenty_devices_three_dropping_after_sharing_keys_and_what_the_server_saw(
    artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = read_manifest(artifacts)
    names = manifest.base_names
    deltas: dict[str, np.ndarray] = {}  # each survivor's clipped delta, as its device computed it
    original = SecureRound.delta

    def recorded(self: SecureRound, *args: object) -> tuple[np.ndarray, bool]:
        delta, unclipped = original(self, *args)  # type: ignore[arg-type]
        deltas[self.session.device_id] = delta
        return delta, unclipped

    monkeypatch.setattr(SecureRound, "delta", recorded)
    stored_while_open: dict[Path, bytes] = {}  # every file of the server's, once all masked inputs are in

    def snapshot(exchange: Exchange) -> None:
        # The first unmasking request a device receives: the masked stage is over, the round not.
        if exchange.method == "GET" and exchange.path.endswith("/unmask") and exchange.status == 200:
            with lock:
                if not stored_while_open:
                    root = tmp_path / "server"
                    stored_while_open.update({p: p.read_bytes() for p in root.rglob("*") if p.is_file()})

    lock = threading.Lock()
    devices: dict[int, Device] = {}
    errors: list[BaseException] = []
    traces = {i: RecordingTransport() for i in range(DEVICES)}  # what each device asked, and got
    events: dict[int, list[object]] = {i: [] for i in range(DEVICES)}

    def run(i: int) -> None:
        client = ProtocolClient(proxy.url, transport=traces[i])
        options = DeviceOptions(client_id=i, seed=0, max_idle_wait=0.5)
        faults = Faults(dropout=1.0 if i < DROPPING else 0.0)
        local = share(DATA, i)
        device = Device(client, DeviceStorage(tmp_path / f"device_{i}"), lambda _m: local, options, ENROLL,
                        on_event=events[i].append, compute_lock=lock, plan=faults)  # fmt: skip
        devices[i] = device
        try:
            device.run(max_rounds=1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    with (
        serve(artifacts, tmp_path / "server", **SERVER) as server,  # type: ignore[arg-type]
        RecordingProxy(server.url, after=snapshot).running() as proxy,
    ):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(DEVICES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not errors, errors[0]
        for _ in range(100):  # the last answer is in; the server's clock closes the round within a tick
            info = httpx.get(f"{server.url}/v1/rounds/1", headers=admin()).json()
            if info["state"] != "open":
                break
            time.sleep(0.2)
        published = httpx.get(f"{server.url}/v1/models/1/base", headers=admin())
        v0 = httpx.get(f"{server.url}/v1/models/0/base", headers=admin())
    assert info["state"] == "closed", info
    survivors = sorted(deltas)
    if len(survivors) != DEVICES - DROPPING:  # say what the honest devices left out saw, and the server
        out = [i for i, d in devices.items() if i >= DROPPING and d.device_id not in deltas]
        seen = "\n".join(f"device {i} ({devices[i].device_id}): events {events[i]}\n  " + "\n  ".join(traces[i].trace)
                         for i in out)  # fmt: skip
        log = "".join((tmp_path).glob("server-*.log").__next__().read_text().splitlines(keepends=True)[-60:])
        pytest.fail(f"{len(survivors)} survivors, not {DEVICES - DROPPING}; round {info}\n{seen}\nserver log:\n{log}")
    samples = {d.device_id: Client(*share(DATA, i).tensors(manifest)).num_samples for i, d in devices.items()}
    cap = 1000
    w = np.array([min(samples[d], cap) for d in survivors], dtype=np.float64)
    before = _flat(weights.decode(v0.content, "v0"), names)
    after = _flat(weights.decode(published.content, "v1"), names)
    fedavg = before + sum(wi * deltas[d] for wi, d in zip(w, survivors, strict=True)) / w.sum()
    words = len(before) + 1
    scale = ((2**31 - 1) // DEVICES - 1) / 1.0  # FixedPoint(clip 1, 20 devices, cap 1000)
    quantization = len(survivors) / (2 * scale) * cap / w.sum()
    float32 = float(np.spacing(np.abs(fedavg).astype(np.float32)).max())
    difference = float(np.max(np.abs(after - fedavg)))
    print(f"17 survivors: max abs difference {difference:.3g}, bound {quantization:.3g} (quantization) "
          f"+ {float32:.3g} (the published base's float32 rounding)")  # fmt: skip
    assert difference <= quantization + float32
    # What went out: no masked input equals, or correlates with, its device's update. Pearson's r
    # of n independent values is about N(0, 1/n): |r| < 6/sqrt(n) fails by chance with p < 2e-9.
    masked = proxy.requests("POST", "/secagg/masked")
    assert len(masked) == len(survivors)
    bound = 6 / math.sqrt(words)
    true_words = {}
    fixed = FixedPoint(1.0, DEVICES, cap)
    for d in survivors:
        true_words[d] = fixed.encode(deltas[d], samples[d])
    for exchange in masked:
        sent = np.frombuffer(exchange.body, dtype="<u4")
        for d in survivors:
            assert not np.array_equal(sent, true_words[d])
            r = np.corrcoef(sent.astype(np.float64), true_words[d].view(np.int32).astype(np.float64))[0, 1]
            assert abs(r) < bound, (d, r)
    assert not proxy.requests("POST", "/updates")  # nothing sent in the clear
    sent_bytes = b"".join(e.body for e in proxy.exchanges)
    for d in survivors:
        assert deltas[d][:8].astype("<f4").tobytes() not in sent_bytes
    # What the server kept while the round was open: one masked vector per survivor (the size of
    # one, each the bytes its device sent) and no file holding an update's bytes (its database and
    # write-ahead log included). The round's folder is removed once it closes.
    kept = {p.name: b for p, b in stored_while_open.items() if p.suffix == ".masked"}
    assert len(kept) == len(survivors), sorted(p.name for p in stored_while_open)
    assert {len(b) for b in kept.values()} == {4 * words}
    assert sorted(kept.values()) == sorted(e.body for e in masked)
    stored = b"".join(stored_while_open.values())
    for d in survivors:
        assert true_words[d][:16].astype("<u4").tobytes() not in stored
        assert deltas[d][:8].astype("<f4").tobytes() not in stored
    assert not list((tmp_path / "server").rglob("*.masked"))


def test_a_device_that_cannot_take_part_is_refused_with_a_clear_error(server_artifacts: Path, tmp_path: Path) -> None:
    with serve(server_artifacts, tmp_path / "server", **SERVER) as server:  # type: ignore[arg-type]
        http = httpx.Client(base_url=server.url)
        r = http.post("/v1/devices", json={"enrollment_key": ENROLL})
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        r = http.get("/v1/task", headers=headers)  # no Fedper-Capabilities: a revision 1.5 client
        assert r.status_code == 403 and r.json()["code"] == ErrorCode.SECAGG_UNSUPPORTED
        assert "revision 1.7" in r.json()["message"]
        r = http.post("/v1/rounds/1/updates", headers=headers, content=b"x")
        assert r.status_code == 409 and r.json()["code"] == ErrorCode.SECURE_ROUND
        http.close()


@pytest.mark.slow
def test_python_devices_in_a_secure_dp_round_send_their_bit_and_the_server_publishes(
    artifacts: Path, tmp_path: Path
) -> None:
    """``--secagg --dp`` with the device runtime: four devices, every one drawn (q = 1), each
    sends a masked input of the base's floats, its unclipped bit and its weight; the round is
    published with its noise and counted in the privacy spent."""
    words = sum(math.prod(shape) for _, shape in read_manifest(artifacts).layout("base"))
    recording = RecordingTransport()
    lock = threading.Lock()
    errors: list[BaseException] = []
    # A DP round is published at its deadline, also a secure one: the test waits for SERVER's 60 s.
    config = {**SERVER, "target_clients": 4, "cohort_size": 4, "start_devices": 4, "dp": True,
              "dp_noise_multiplier": 0.5, "dp_clip": 0.05, "dp_delta": 1e-5, "dp_count_stddev": 1.0}  # fmt: skip
    with serve(artifacts, tmp_path / "server", **config) as server:  # type: ignore[arg-type]

        def run(i: int) -> None:
            client = ProtocolClient(server.url, transport=recording)
            local = share(DATA, i)
            options = DeviceOptions(client_id=i, seed=0, max_idle_wait=0.5)
            device = Device(client, DeviceStorage(tmp_path / f"device_{i}"), lambda _m: local, options, ENROLL,
                            compute_lock=lock)  # fmt: skip
            try:
                device.run(max_rounds=1)
            except BaseException as exc:
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not errors, errors[0]
        for _ in range(300):  # until the round's deadline has passed
            status = httpx.get(f"{server.url}/v1/status").json()
            if status["rounds_closed"] == 1:
                break
            time.sleep(0.2)
    assert status["rounds_closed"] == 1 and status["privacy"]["rounds"] == 1, status
    masked = [body for method, path, body in recording.requests if method == "POST" and "masked" in path]
    assert len(masked) == 4 and {len(b) for b in masked} == {4 * (words + 2)}
