"""Devices and fleets against a real ``fedper serve`` process over HTTP, running the real ``.pte``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fedper._recipes.simulation import SimulationConfig
from fedper._recipes.simulation import run as simulate
from fedper.common import weights
from fedper.common.manifest import Manifest, read_manifest, sha256_file
from fedper.common.protocol import Metadata
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from fedper.device_runtime.client import ProtocolClient, RefusedError
from fedper.device_runtime.device import Device, DeviceOptions, make_trainer, metric_metadata
from fedper.device_runtime.device_host import FleetEvent, SharedTrainers, host_devices
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.emulation import Faults
from fedper.device_runtime.events import (
    DeviceEvent,
    DeviceFailed,
    FinalEvaluated,
    Finished,
    Refused,
    RoundReport,
    WorkerDone,
)
from fedper.device_runtime.fleet import _collect, run_fleet
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.local_data import LocalData, share
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.models import ModelConfig
from fedper.results import RunRecorder
from fedper.trainer import Trainer, to_torch
from tests.support.recording_transport import RecordingTransport
from tests.support.server_support import ENROLL, FakeClock, InProcessServer, admin, decode_update, round_info, serve

# Three clients of the digits, two classes each: small, strongly non-IID, real images.
DATA = DataConfig(dataset="digits", partition="classes", num_clients=3, classes_per_client=2, seed=0)
SERVER = {"rounds": 2, "target_clients": 3, "min_clients": 3, "local_epochs": 1, "retry_after": 1}


def _run_devices(
    url: str,
    root: Path,
    options: list[DeviceOptions],
    transport: httpx.BaseTransport | None = None,
    events: list[list[DeviceEvent]] | None = None,
    faults: list[Faults] | None = None,
) -> list[list[RoundReport]]:
    """Devices as threads of this process (one compute lock, as in a fleet worker); each
    device's events go into ``events[i]`` when given; with ``faults``, device i is an emulated
    one that fails as ``faults[i]`` says."""
    lock = threading.Lock()
    reports: list[list[RoundReport]] = [[] for _ in options]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        client = ProtocolClient(url, transport=transport)
        local = share(DATA, options[i].client_id)
        on_event = events[i].append if events is not None else None
        storage = DeviceStorage(root / f"device_{i}")
        if faults is None:
            device = Device(client, storage, lambda _m: local, options[i], ENROLL, on_event, compute_lock=lock)
        else:
            device = Device(client, storage, lambda _m: local, options[i], ENROLL, on_event, compute_lock=lock,
                            plan=faults[i])  # fmt: skip
        try:
            reports[i] = device.run()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(options))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    if errors:
        raise errors[0]
    return reports


class ThroughTestClient(httpx.BaseTransport):
    """A device's requests to an :class:`InProcessServer`, sent by its test client (whose own
    transport is another httpx's): the app in this process, on the test's clock."""

    def __init__(self, http: Any) -> None:
        self._http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self._http.request(request.method, str(request.url), headers=dict(request.headers), content=request.read())
        # The body comes decoded: the headers that described the encoded one would mislead.
        headers = [
            (k, v) for k, v in r.headers.multi_items() if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(r.status_code, headers=headers, content=r.content, request=request)


def _round(url: str, number: int) -> dict:
    return httpx.get(f"{url}/v1/rounds/{number}", headers=admin()).json()


def _latest_base(url: str) -> dict[str, np.ndarray]:
    r = httpx.get(f"{url}/v1/admin/models/latest/base", headers=admin())
    assert r.status_code == 200, r.text
    return decode_update(r.content)[0]


@pytest.fixture(scope="module")
def fleet_runs(artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The same 3-device, 2-round FedPer run as a fleet (ExecuTorch, then eager) and as a simulation."""
    root = tmp_path_factory.mktemp("fleets")
    runs: dict[str, dict] = {}
    for engine in ("executorch", "eager"):
        with serve(artifacts, root / f"server-{engine}", **SERVER) as server:  # type: ignore[arg-type]
            fleet = FleetConfig(runtime=RuntimeConfig(server=server.url, engine=engine, threads=1), devices=3, workers=2,
                                storage=root / engine, out=root / engine / "results", max_idle_wait=0.5)  # fmt: skip
            recorder = run_fleet(fleet, DATA, ENROLL, show=False)
            runs[engine] = {
                "results": json.loads((fleet.out / "results.json").read_text()),  # type: ignore[operator]
                "records": recorder.records("fedper"),
                "status": httpx.get(f"{server.url}/v1/status").json(),
                "rounds": [_round(server.url, n) for n in (1, 2)],
                "final_base": _latest_base(server.url),
                "storage": fleet.storage,
                "out": fleet.out,
            }
    manifest = read_manifest(artifacts)
    sim = SimulationConfig(algorithms=("fedper",), kp=2, rounds=2, training=TrainConfig(local_epochs=1), model=ModelConfig(alpha=manifest.model.alpha),
                           threads=1, out=root / "simulation")  # fmt: skip
    runs["simulate"] = {"records": simulate(sim, DATA).records("fedper")}
    return runs


@pytest.mark.slow
@pytest.mark.numeric
def test_fleet_runs_the_exported_program_over_http(fleet_runs, artifacts, claim):
    run = fleet_runs["executorch"]
    assert run["status"]["state"] == "finished" and run["status"]["model_version"] == 2
    assert run["status"]["devices"] == 3
    assert [r["state"] for r in run["rounds"]] == ["closed", "closed"]
    assert [r["received"] for r in run["rounds"]] == [3, 3]
    records = [r for r in run["records"] if not r.final]
    assert sorted((r.round, r.client) for r in records) == [(n, c) for n in (1, 2) for c in range(3)]
    # Every device reported what it trained on: its own share's distinct training examples.
    for r in records:
        assert r.num_samples == len(share(DATA, r.client).train)
        assert r.accuracy_after is not None and r.train_loss is not None
    # One round of training lifts accuracy on the devices' own test splits well above the
    # exported model's (which predicts few of the 10 classes): by 0.32 under every kernel set and
    # thread count (make test-portable), so the bound leaves 0.12 of room.
    before = np.mean([r.accuracy for r in records if r.round == 1])
    after = np.mean([r.accuracy for r in records if r.round == 2])
    claim.above("mean accuracy gain in round 1", after - before, 0.2)
    for name in ("results.json", "metrics.csv", "accuracy_per_round.png"):
        assert (run["out"] / name).stat().st_size > 0
    # Each device kept its own, trained head; heads differ from each other and from the export's.
    manifest = read_manifest(artifacts)
    sha = sha256_file(artifacts / "manifest.json")
    initial = weights.load(artifacts / manifest.artifacts["initial_head"])
    heads = [weights.load(run["storage"] / f"device_{i:03d}" / "heads" / f"{sha}.safetensors") for i in range(3)]
    for head in heads:
        assert sorted(head) == sorted(manifest.head_names)
        assert not np.allclose(head["classifier.weight"], initial["classifier.weight"])
    assert not np.allclose(heads[0]["classifier.weight"], heads[1]["classifier.weight"])
    # Once the run finished, every device scored the final base (version 2) with its final head:
    # the final point (round 3 = after round 2), which is the headline.
    finals = sorted((r for r in run["records"] if r.final), key=lambda r: r.client)
    assert [(r.round, r.client) for r in finals] == [(3, c) for c in range(3)]
    # The device scores with its inference program, the check with eager PyTorch: logits that
    # differ by rounding may flip a near-tie, so one prediction in the ~72 may differ.
    for r, head in zip(finals, heads, strict=True):
        assert r.accuracy_after is None and r.num_samples == len(share(DATA, r.client).train)
        eager = _accuracy(artifacts, run["final_base"], head, r.client)
        claim.below(f"|device - eager| final accuracy, device {r.client}", abs(r.accuracy - eager), 0.02)
    headline = run["results"]["algorithms"]["fedper"]
    assert headline["final_per_client"] == {str(r.client): r.accuracy for r in finals}
    assert (headline["final_round"], headline["final_point"]) == (3, "after round 2")
    assert headline["last5_rounds"] == [1, 2, 3]
    assert run["results"]["rounds"]["fedper"][-1]["final"] is True
    # What computed the floats: this machine's kernel set, the workers' one thread each.
    environment = run["results"]["environment"]
    assert environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (
        environment["torch_threads"] == 1 and environment["executorch"] == read_manifest(artifacts).runtime.executorch
    )


@pytest.mark.slow
@pytest.mark.numeric
def test_engines_and_simulation_agree(fleet_runs, claim):
    """ExecuTorch fleet, eager fleet and `fedper simulate`: same algorithm, data, batches, FedAvg."""

    def by_key(records):
        return {(r.round, r.client): r for r in records}

    et, eager, sim = (by_key(fleet_runs[k]["records"]) for k in ("executorch", "eager", "simulate"))
    assert et.keys() == eager.keys() == sim.keys()
    assert {k for k, r in sim.items() if r.final} == {k for k, r in et.items() if r.final} == {(3, c) for c in range(3)}
    for rnd in (1, 2, 3):
        keys = [k for k in sorted(sim) if k[0] == rnd]
        accuracy = max(max(abs(eager[k].accuracy - sim[k].accuracy), abs(et[k].accuracy - sim[k].accuracy))
                       for k in keys)  # fmt: skip
        # Round 1 scores the exported initial weights, the same model everywhere: engines differ
        # only by rounding, which can flip a near-tie (one prediction of ~72 is 0.014; measured:
        # none); a wrong model would be off by far more. Later rounds carry the engines' training
        # differences (measured: at most 2 predictions of ~72 in round 3).
        claim.below(f"round {rnd}: largest |engine - simulation| accuracy", accuracy, 0.03 if rnd == 1 else 0.1)
        if rnd == 3:  # the final point: evaluated, not trained
            assert all(r[k].train_loss is None for r in (sim, eager, et) for k in keys)
            continue
        # Eager PyTorch in a fleet computes what the simulation computes (one thread, same batches,
        # same FedAvg up to summation order).
        loss_e = max(abs(eager[k].train_loss / sim[k].train_loss - 1) for k in keys)
        claim.below(f"round {rnd}: largest relative |eager fleet - simulation| loss", loss_e, 2e-3)
        # ExecuTorch's fp32 sums differ from eager's by rounding, and training the whole model is
        # chaotic (test_export: a 1e-9 difference is O(1) within a few steps), so the two runs
        # part within round 1. Measured over kernel sets and thread counts (make test-portable):
        # round 1 at most 2.6% apart, round 2 at most 4.9% on an AVX2 CPU, but 16.1% under ATen's
        # AVX-512 kernels on an AVX-512 CPU (docs/TESTING.md): round 1 (the same start everywhere)
        # is bounded at about 3x, round 2 (each run's own base) at about 2x the largest seen.
        loss_x = max(abs(et[k].train_loss / sim[k].train_loss - 1) for k in keys)
        claim.below(f"round {rnd}: largest relative |executorch fleet - simulation| loss", loss_x,
                    0.08 if rnd == 1 else 0.3)  # fmt: skip


@pytest.mark.slow
def test_no_head_tensor_ever_leaves_a_device(artifacts, tmp_path):
    manifest = read_manifest(artifacts)
    recording = RecordingTransport()
    with serve(artifacts, tmp_path / "server", **{**SERVER, "target_clients": 2, "min_clients": 2}) as s:
        options = [DeviceOptions(client_id=i, seed=0, max_idle_wait=0.5) for i in range(2)]
        reports = _run_devices(s.url, tmp_path / "devices", options, recording)
    assert [len(r) for r in reports] == [2, 2]
    uploads = [body for method, path, body in recording.requests if method == "POST" and "/updates" in path]
    assert len(uploads) == 4
    for body in uploads:
        tensors, _meta = decode_update(body)
        assert sorted(tensors) == sorted(manifest.base_names)
    # Neither the names nor the trained values of any head tensor are in any request body.
    sha = sha256_file(artifacts / "manifest.json")
    heads = [weights.load(tmp_path / "devices" / f"device_{i}" / "heads" / f"{sha}.safetensors") for i in range(2)]
    everything_sent = b"".join(body for _, _, body in recording.requests)
    for name in manifest.head_names:
        assert name.encode() not in everything_sent
        for head in heads:
            assert head[name].astype("<f4").tobytes()[:64] not in everything_sent
    # And the server stored no head tensor: scan every file it wrote (SQLite, blobs, models).
    for path in (tmp_path / "server").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for name in manifest.head_names:
                assert name.encode() not in data, (path, name)


@pytest.mark.slow
@pytest.mark.numeric
def test_dropout_with_min_clients_closes_rounds_at_the_deadline(artifacts, tmp_path, claim):
    manifest = read_manifest(artifacts)
    recording = RecordingTransport()
    # 20 s: room for two devices to train before the deadline even on a loaded machine (8 s was flaky)
    config = {**SERVER, "target_clients": 3, "min_clients": 2, "round_timeout": 20}
    with serve(artifacts, tmp_path / "server", **config) as s:  # type: ignore[arg-type]
        options = [DeviceOptions(client_id=i, seed=0, max_idle_wait=0.5) for i in range(3)]
        faults = [Faults(), Faults(), Faults(dropout=1.0)]  # device 2 quits every round after evaluating
        events: list[list[DeviceEvent]] = [[] for _ in options]
        reports = _run_devices(s.url, tmp_path / "devices", options, recording, events, faults)
        rounds = [_round(s.url, n) for n in (1, 2)]
        final = _latest_base(s.url)
    assert [len(r) for r in reports[:2]] == [2, 2]
    assert [r.uploaded for r in reports[2]] == [False, False]  # evaluated, then quit, in both rounds
    assert [r["state"] for r in rounds] == ["closed", "closed"]
    assert [r["received"] for r in rounds] == [2, 2]
    # The result of round 2 is the sample-weighted mean of exactly the two uploads it received.
    bodies = [b for m, p, b in recording.requests if m == "POST" and p == "/v1/rounds/2/updates"]
    assert len(bodies) == 2
    decoded = [decode_update(b) for b in bodies]
    n = np.array([float(meta["num_samples"]) for _, meta in decoded])
    for name in manifest.base_names:
        expected = sum(w * t[name].astype(np.float64) for w, (t, _) in zip(n / n.sum(), decoded, strict=True))
        np.testing.assert_allclose(final[name], expected, rtol=1e-5, atol=1e-6)
    # After the run, the two devices that trained evaluated the final base with their heads; the
    # one that never trained has no head and skipped that final evaluation.
    finals = [[e for e in device_events if isinstance(e, FinalEvaluated)] for device_events in events]
    assert [[(e.round, e.model_version) for e in f] for f in finals] == [[(3, 2)], [(3, 2)], []]
    assert all(isinstance(device_events[-1], Finished) for device_events in events)
    sha = sha256_file(artifacts / "manifest.json")
    head_0 = weights.load(tmp_path / "devices" / "device_0" / "heads" / f"{sha}.safetensors")
    eager = _accuracy(artifacts, final, head_0)
    claim.below("|device - eager| final accuracy", abs(finals[0][0].accuracy - eager), 0.02)  # one near-tie of ~72
    assert not (tmp_path / "devices" / "device_2" / "heads").exists()


@pytest.mark.slow
def test_a_device_without_test_examples_omits_accuracy_and_its_round_counts(server_artifacts, tmp_path):
    """accuracy of an empty test split is undefined: the upload carries no metric.accuracy (the
    server refuses NaN), and the round closes with the device's update and its train_loss."""
    recording = RecordingTransport()
    local = share(DATA, 0)
    no_test = LocalData(local.train, local.test.subset(np.arange(0)))
    events: list[DeviceEvent] = []
    config = {**SERVER, "rounds": 1, "target_clients": 1, "min_clients": 1}
    with serve(server_artifacts, tmp_path / "server", **config) as s:  # type: ignore[arg-type]
        client = ProtocolClient(s.url, transport=recording)
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=0.5)
        device = Device(client, DeviceStorage(tmp_path / "device"), lambda _m: no_test, options, ENROLL, events.append)
        try:
            reports = device.run()
        finally:
            client.close()
        round_1 = _round(s.url, 1)
    assert [(r.accuracy, r.accuracy_after, r.uploaded) for r in reports] == [(None, None, True)]
    assert reports[0].train_loss is not None and reports[0].received == 1
    assert round_1["state"] == "closed" and round_1["received"] == 1
    assert "accuracy" not in round_1["metrics"] and "train_loss" in round_1["metrics"]
    (body,) = [b for m, p, b in recording.requests if m == "POST" and p == "/v1/rounds/1/updates"]
    metadata = decode_update(body)[1]
    assert sorted(k for k in metadata if k.startswith("metric.")) == ["metric.train_loss"]
    assert not [e for e in events if isinstance(e, FinalEvaluated)]  # nothing to score at the end either
    assert isinstance(events[-1], Finished)


class HeadRecorder:
    """A trainer that keeps every head it was given and every head it handed back."""

    def __init__(self, inner: Trainer, head_names: list[str]):
        self.inner, self.head_names = inner, head_names
        self.heads_in: list[dict[str, np.ndarray]] = []
        self.heads_out: list[dict[str, np.ndarray]] = []

    def set_tensors(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        if set(self.head_names) <= set(tensors):
            self.heads_in.append({n: np.array(tensors[n], copy=True) for n in self.head_names})
        self.inner.set_tensors(tensors)

    def get_tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        names = list(names)
        out = self.inner.get_tensors(names)
        if names == self.head_names:
            self.heads_out.append({n: out[n].detach().numpy().copy() for n in names})
        return out

    def start_round(self, learning_rate: float, momentum: float) -> None:
        self.inner.start_round(learning_rate, momentum)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return self.inner.train_step(x, y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.predict(x)


@pytest.mark.slow
def test_a_device_whose_slot_expires_is_refused_asks_again_and_the_fleet_counts_it(server_artifacts, tmp_path):
    """Cohort of one, report timeout 15 s, on the server's clock that the device's waits move:
    the device straggles 15.5 s after its first training, its upload is refused (not_in_cohort),
    it waits Retry-After, asks again, trains again from the head it had (the refused round's head
    was staged, never committed) and is accepted. Its events say so, and the fleet's live table
    counts one refusal and nobody still training."""
    events: list[DeviceEvent] = []
    waits: list[float] = []
    recorders: list[HeadRecorder] = []
    clock = FakeClock()
    config = {**SERVER, "rounds": 1, "target_clients": 1, "min_clients": 1, "cohort_size": 1,
              "over_selection": 1.0, "report_timeout": 15}  # fmt: skip
    server = InProcessServer(server_artifacts, tmp_path / "server", clock=clock, **config)

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        # Only the first straggle is late; the second attempt (the same round's draw: straggling
        # again) takes no time, so that the retried upload is within its new slot.
        clock.now += seconds if len(waits) <= 2 else 0
        server.state.rounds.tick()

    def trainer_for(_sha: str, directory: Path, manifest: Manifest) -> Trainer:
        recorders.append(HeadRecorder(make_trainer("eager", directory, manifest), manifest.head_names))
        return recorders[-1]

    with server:
        client = ProtocolClient(str(server.http.base_url), transport=ThroughTestClient(server.http))
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=30)
        storage = DeviceStorage(tmp_path / "device")
        device = Device(client, storage, lambda _m: share(DATA, 0), options, ENROLL, events.append, sleep=sleep,
                        trainer_for=trainer_for, plan=Faults(straggler=1.0, straggler_delay=15.5))  # fmt: skip
        try:
            reports = device.run()
        finally:
            client.close()
        assert round_info(server.http, 1)["received"] == 1
    assert waits[0] == 15.5 and waits[2] == 15.5, waits  # both trainings straggled
    # After the refusal the device waited what the 409's Retry-After said (1-2 s here).
    assert 1 <= waits[1] <= 2, waits
    # Both trainings of round 1 started from the exported head; the stored head is the second's.
    manifest = read_manifest(server_artifacts, verify_files=False)
    initial = weights.load(server_artifacts / manifest.artifacts["initial_head"])
    (recorder,) = recorders
    # Evaluate and train, twice, then the final evaluation (410) with the stored head.
    assert len(recorder.heads_in) == 5 and len(recorder.heads_out) == 2
    for head in recorder.heads_in[:4]:
        assert all(np.array_equal(head[n], initial[n]) for n in manifest.head_names)
    sha = sha256_file(server_artifacts / "manifest.json")
    stored = storage.load_head(sha)
    assert stored is not None and not np.array_equal(stored[manifest.head_names[0]], initial[manifest.head_names[0]])
    assert all(np.array_equal(stored[n], recorder.heads_out[1][n]) for n in manifest.head_names)
    assert all(np.array_equal(stored[n], recorder.heads_in[4][n]) for n in manifest.head_names)
    assert not storage.staged_head_path(sha).exists()
    kinds = [e.kind for e in events if e.kind in ("training", "refused", "uploaded")]
    assert kinds == ["training", "refused", "training", "uploaded"]
    assert [e for e in events if isinstance(e, Refused)] == [Refused(1, "not_in_cohort")]
    assert [r.round for r in reports] == [1]

    class Replay:
        count = 1

        def __init__(self) -> None:
            self.queue: list[tuple[int, FleetEvent]] = [(0, e) for e in events] + [(0, WorkerDone(0))]

        def next_event(self, timeout: float) -> tuple[int, FleetEvent] | None:
            return self.queue.pop(0) if self.queue else None

        def running(self) -> bool:
            return bool(self.queue)

    progress = _collect(Replay(), FleetConfig(devices=1), RunRecorder({}), show=False)
    assert (progress.refused, progress.uploads, progress.training) == (1, 1, set())


def _revoke(url: str, device_id: str | None) -> None:
    r = httpx.post(f"{url}/v1/admin/devices/{device_id}/revoke", headers=admin())
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_revoked_device_enrolls_again_once_and_a_second_401_ends_its_run(server_artifacts, tmp_path):
    """PROTOCOL.md: 401 means an unknown or revoked token. The device enrolls again (it holds the
    key) and finishes the round; revoked again within the same run, it stops with the 401."""
    config = {**SERVER, "rounds": 1, "target_clients": 1, "min_clients": 1}
    with serve(server_artifacts, tmp_path / "server", **config) as s:  # type: ignore[arg-type]
        client = ProtocolClient(s.url)
        storage = DeviceStorage(tmp_path / "device")
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=0.5)
        device = Device(client, storage, lambda _m: share(DATA, 0), options, ENROLL)
        first = device.ensure_enrolled()
        _revoke(s.url, first)
        try:
            assert [r.round for r in device.run()] == [1]
        finally:
            client.close()
        assert device.device_id != first and storage.credentials() == (device.device_id, client.token)

    with serve(server_artifacts, tmp_path / "server2", **config) as s:  # type: ignore[arg-type]
        client = ProtocolClient(s.url)
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=0.5)
        device = Device(client, DeviceStorage(tmp_path / "device2"), lambda _m: share(DATA, 0), options, ENROLL,
                        sleep=lambda _s: _revoke(s.url, device.device_id), plan=Faults(straggler=1.0))  # fmt: skip
        _revoke(s.url, device.ensure_enrolled())  # the first 401 comes on the task, the second on the upload
        try:
            with pytest.raises(RefusedError) as refused:
                device.run()
        finally:
            client.close()
        assert refused.value.status == 401
        assert _round(s.url, 1)["received"] == 0


@pytest.mark.slow
def test_a_manifest_is_pinned_only_once_its_trainer_loaded(server_artifacts, tmp_path):
    """A runtime that cannot load the programs must not pin their manifest: the device would
    otherwise refuse a later compatible export as a conflict with one it never trained."""
    config = {**SERVER, "rounds": 1, "target_clients": 1, "min_clients": 1}

    def cannot_load(_sha: str, _directory: Path, _manifest: Manifest) -> Trainer:
        raise RuntimeError("this runtime cannot load the programs")

    with serve(server_artifacts, tmp_path / "server", **config) as s:  # type: ignore[arg-type]
        client = ProtocolClient(s.url)
        storage = DeviceStorage(tmp_path / "device")
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=0.5)
        device = Device(client, storage, lambda _m: share(DATA, 0), options, ENROLL, trainer_for=cannot_load)
        try:
            with pytest.raises(RuntimeError, match="cannot load"):
                device.run()
        finally:
            client.close()
    assert storage.pinned_manifest() is None


def test_bases_are_kept_per_manifest(tmp_path):
    """Model versions restart at 0 in every run: an old run's v50 is another model, not a newer one."""
    storage = DeviceStorage(tmp_path)
    old, new = "a" * 64, "b" * 64
    storage.save_base(old, 50, b"old", '"e50"')
    storage.save_base(new, 0, b"new", '"e0"')
    assert storage.base_path(new, 0).read_bytes() == b"new"
    assert storage.base_etag(new, 50) is None and storage.base_etag(old, 50) == '"e50"'
    with pytest.raises(ValueError, match="not a sha256"):
        storage.base_path("../x", 0)


@pytest.mark.slow
def test_the_devices_of_a_fleet_host_share_one_loaded_training_program(artifacts, tmp_path, monkeypatch):
    """Three devices hosted by one process (as in a worker process or a Ray actor) train with the
    ExecuTorch engine through one loaded program: a program per device is ~170 MB of planned
    memory, which ran a 1000-device fleet out of memory."""
    import fedper.device_runtime.device as device_module

    loads: list[str] = []
    make_trainer = device_module.make_trainer

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(threading.current_thread().name)
        return make_trainer(*args, **kwargs)

    monkeypatch.setattr(device_module, "make_trainer", counting)
    events: list[tuple[int, FleetEvent]] = []
    with serve(artifacts, tmp_path / "server", **{**SERVER, "rounds": 1}) as server:  # type: ignore[arg-type]
        fleet = FleetConfig(runtime=RuntimeConfig(server=server.url, threads=1), devices=3, storage=tmp_path / "fleet",
                            max_idle_wait=0.5)  # fmt: skip
        trainers = SharedTrainers("executorch", "onnx")
        host_devices(0, [0, 1, 2], fleet, DATA, ENROLL, events.append, trainers)
        assert _round(server.url, 1)["received"] == 3
    assert not [e for _, e in events if isinstance(e, DeviceFailed)]
    assert len(loads) == 1 and trainers.loaded == 1


def test_metric_metadata_leaves_out_undefined_and_non_finite_values():
    metrics = {"accuracy": None, "accuracy_after": 0.5, "train_loss": float("nan"), "x": float("inf"), "y": -1.25}
    assert metric_metadata(metrics) == {"metric.accuracy_after": "0.5", "metric.y": "-1.25"}


def _accuracy(artifacts: Path, base: dict[str, np.ndarray], head: dict[str, np.ndarray], client: int = 0) -> float:
    """A client's test accuracy with this base and head, in eager PyTorch."""
    from fedper.device_runtime.device import make_trainer
    from fedper.local_training import evaluate

    manifest = read_manifest(artifacts)
    trainer = make_trainer("eager", artifacts, manifest)
    trainer.set_tensors(to_torch({**base, **head}))
    _, _, x_test, y_test = share(DATA, client).tensors(manifest)
    return evaluate(trainer, x_test, y_test)


def _start_device(url: str, storage: Path, log: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "fedper.cli", "device", "--server", url, "--dataset", "digits",
            "--partition", "classes", "--clients", "3", "--classes-per-client", "2", "--client-id", "0",
            "--seed", "0", "--storage", str(storage)]  # fmt: skip
    env = {**os.environ, "FEDPER_ENROLLMENT_KEY": ENROLL}
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 300) -> None:
    assert proc.stderr is not None
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"device exited before {needle!r}")
        if needle in line:
            return
    raise AssertionError(f"no {needle!r} within {timeout} s")


@pytest.mark.slow
@pytest.mark.numeric
def test_device_killed_mid_training_keeps_head_and_token_and_rejoins(artifacts, tmp_path, claim):
    sha = sha256_file(artifacts / "manifest.json")
    storage = tmp_path / "device"
    head_file = storage / "heads" / f"{sha}.safetensors"
    config = {**SERVER, "target_clients": 1, "min_clients": 1, "local_epochs": 3}
    with serve(artifacts, tmp_path / "server", **config) as s:  # type: ignore[arg-type]
        proc = _start_device(s.url, storage, tmp_path / "device.log")
        try:
            _wait_for_line(proc, "uploaded {'round': 1")
            after_round_1 = head_file.read_bytes()
            identity = (storage / "device.json").read_text()
            _wait_for_line(proc, "training {'round': 2")
            proc.send_signal(signal.SIGKILL)  # mid-training: three epochs take seconds
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
        assert _round(s.url, 2)["received"] == 0
        assert head_file.read_bytes() == after_round_1  # the whole head of round 1, nothing half-written
        assert not [p for p in head_file.parent.iterdir() if p != head_file]  # no temporary leftovers
        shutil.copy(head_file, tmp_path / "head-before-restart")
        proc = _start_device(s.url, storage, tmp_path / "device2.log")
        try:
            _, terminal = proc.communicate(timeout=300)
            assert proc.returncode == 0, terminal
        finally:
            if proc.poll() is None:
                proc.kill()
        status = httpx.get(f"{s.url}/v1/status").json()
        round_2 = _round(s.url, 2)
        base_v1 = decode_update(httpx.get(f"{s.url}/v1/models/1/base", headers=admin()).content)[0]
    assert (storage / "device.json").read_text() == identity  # same token: not a second enrollment
    # The terminal shows the device's own lines; the runtime's (ExecuTorch's cpuinfo probes) and
    # the libraries' (httpx's requests) are in its storage's device.log.
    assert "round(s) done" in terminal and "cpuinfo_utils.cpp" not in terminal and "HTTP Request" not in terminal
    device_log = (storage / "device.log").read_text()
    assert "cpuinfo_utils.cpp" in device_log and "HTTP Request" in device_log
    assert status["devices"] == 1 and status["state"] == "finished" and status["model_version"] == 2
    assert round_2["state"] == "closed" and round_2["received"] == 1
    # It rejoined with its own head: round 2's reported accuracy (measured before training) is
    # that of base v1 + the head it kept, not of base v1 + the export's initial head.
    reported = round_2["metrics"]["accuracy"]["mean"]
    eager = _accuracy(artifacts, base_v1, weights.load(tmp_path / "head-before-restart"))
    claim.below("|device - eager| accuracy with the kept head", abs(reported - eager), 0.02)  # one near-tie of ~72
    # The kept head is a trained one, not the export's initial head (whose accuracy may happen to
    # be close after one round on two classes).
    initial_head = weights.load(artifacts / read_manifest(artifacts).artifacts["initial_head"])
    kept = weights.load(tmp_path / "head-before-restart")
    claim.above(
        "largest change of a head tensor", max(float(np.abs(kept[k] - initial_head[k]).max()) for k in kept), 1e-2
    )
    assert head_file.read_bytes() != after_round_1


@pytest.mark.slow
def test_devices_clip_their_deltas_for_a_dp_server_and_it_accepts_them(artifacts, tmp_path):
    """A real ``fedper serve --dp`` (revision 1.5) and two Python devices training the exported
    program: every upload carries the DP bit and is within the task's clip by the contract's norm,
    measured here against the version it trained from; the server publishes both rounds at their
    deadlines and reports what they spent."""
    from fedper.common.dp.accountant import epsilon
    from fedper.common.dp.clipping import distance

    manifest = read_manifest(artifacts)
    recording = RecordingTransport()
    clip = 0.05  # below any real delta: every device clips
    dp = {"dp": True, "dp_clip": clip, "dp_clip_learning_rate": 0, "dp_noise_multiplier": 0.5, "dp_delta": 1e-5,
          "checkin_window": 2, "round_timeout": 20, "cohort_size": 2, "target_clients": 2, "min_clients": 1}  # fmt: skip
    with serve(artifacts, tmp_path / "server", **{**SERVER, **dp}) as s:  # type: ignore[arg-type]
        options = [DeviceOptions(client_id=i, seed=0, max_idle_wait=0.5) for i in range(2)]
        reports = _run_devices(s.url, tmp_path / "devices", options, recording)
        status = httpx.get(f"{s.url}/v1/status").json()
    assert [len(r) for r in reports] == [2, 2] and all(r.uploaded for rs in reports for r in rs)
    uploads = [body for method, path, body in recording.requests if method == "POST" and "/updates" in path]
    assert len(uploads) == 4
    for body in uploads:
        tensors, meta = decode_update(body)
        assert meta[Metadata.UNCLIPPED] == "0"
        trained_from = weights.load(tmp_path / "server" / "models" / f"v{meta[Metadata.BASE_VERSION]}.safetensors")
        assert distance(tensors, trained_from, manifest.base_names) <= clip
    spent = status["privacy"]
    assert status["state"] == "finished" and spent["rounds"] == 2
    assert spent["epsilon"] == pytest.approx(epsilon(0.5, 1.0, 2, 1e-5))
