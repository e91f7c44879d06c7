"""Three ``fedper serve`` replicas on one PostgreSQL database and one data directory, behind nginx
(docs/SCALING.md, "Several replicas"): devices (the device runtime's own protocol client, with its
retries) reach whichever replica the proxy picks. In every round one replica is disrupted, in
turn: killed with -9 at a random moment; the one closing the round killed mid-close; or that one
stopped (SIGSTOP) past its lease while another takes the round over, then continued. A killed
replica is started again.

Every update a device was told was accepted (202, or ``duplicate_update`` after a lost answer) is
in its round, every published version is byte for byte what one server on SQLite publishes from
the same accepted updates, and a paused closer that woke up published nothing
(``round_close_fenced``). ``FEDPER_REPLICA_TRIALS`` rounds (default 3, one of each; ``make
test-replicas`` runs 20)."""

from __future__ import annotations

import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedper.common.manifest import Manifest, read_manifest
from fedper.device_runtime.client import NoTask, NotInCohortError, ProtocolClient
from fedper.device_runtime.retry import Backoff
from fedper.server.storage import Database, RoundState
from fedper.server.upload_validation import Upload
from tests.support import load_balancer
from tests.support.server_support import ENROLL, FakeClock, ServerUnderTest, base_like, serve, update_body

DEVICES = 6
TRIALS = int(os.environ.get("FEDPER_REPLICA_TRIALS", "3"))
OPTIONS: dict[str, object] = {
    "target_clients": DEVICES, "min_clients": 1, "round_timeout": 60, "close_lease": 2,
    "max_requests_per_address": 0, "enroll_per_minute": 1000, "forwarded_allow_ips": "127.0.0.1",
    # The closer spends 0.3 s in the operator's publish check: long enough to be caught closing.
    "publish_command": "sh -c 'sleep 0.3' check",
}  # fmt: skip


def _tensors(manifest: Manifest, device: int, number: int) -> dict[str, np.ndarray]:
    return base_like(manifest, seed=1000 * number + device)


def _samples(device: int) -> int:
    return 5 + device


def _take_part(server: str, token: str, device: int, manifest: Manifest) -> tuple[int, str]:
    """One device's round: its task (asking again while it has none), then its update. The
    round it uploaded to, and ``accepted`` (202 or duplicate_update) or why not."""
    client = ProtocolClient(server, token, backoff=Backoff(base=0.05, cap=0.5, attempts=60))
    try:
        for _ in range(200):
            task = client.task()
            if isinstance(task, NoTask):
                time.sleep(min(0.2, task.retry_after))
                continue
            body = update_body(_tensors(manifest, device, task.round), _samples(device), task.model_version)
            try:
                client.upload(task.round, body)
                return task.round, "accepted"
            except NotInCohortError:
                time.sleep(0.1)
            except Exception as exc:  # a refusal: not accepted (the round closed under it, say)
                return task.round, f"refused: {exc}"
        return 0, "no task"
    finally:
        client.close()


def _disrupt(replicas: list[ServerUnderTest], db: Database, number: int, how: str, rng: random.Random) -> str:
    """During round ``number``: ``kill`` -9 a replica at a random moment, ``kill closer`` the one
    holding the round's seal, or ``pause closer`` it (SIGSTOP) past its lease, so that another
    takes the round over, then let it go on (SIGCONT); a killed replica is started again. What
    was done."""
    victim, what = None, "kill any"
    if how != "kill":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and victim is None:
            holder = db.closers.holder(number)
            if holder is not None:
                pid = int(holder.split(":")[1])
                victim = next((r for r in replicas if r.proc is not None and r.proc.pid == pid), None)
                what = how
            elif (db.rounds.get(number) or db.rounds.latest()).state != RoundState.OPEN:  # type: ignore[union-attr]
                break
            time.sleep(0.002)
    if victim is None:
        time.sleep(rng.uniform(0, 0.6))
        victim, what = rng.choice(replicas), f"kill any ({how}: missed)" if how != "kill" else "kill any"
    if what == "pause closer":
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        time.sleep(float(OPTIONS["close_lease"]) + 2)  # type: ignore[arg-type]
        victim.proc.send_signal(signal.SIGCONT)
        return what
    victim.kill()
    victim.start()
    return what


@pytest.fixture
def fleet(server_artifacts: Path, tmp_path: Path, postgres_cluster: Any) -> Any:
    reason = load_balancer.why_not()
    if reason is not None:
        pytest.skip(reason)
    url = postgres_cluster.database()
    data = tmp_path / "data"
    replicas = [serve(server_artifacts, data, database=url, **OPTIONS) for _ in range(3)]
    for r in replicas:
        r.start()
    proxy = load_balancer.LoadBalancer(tmp_path / "nginx", [r.url for r in replicas])
    db = Database(url)
    yield replicas, proxy, db
    db.close()
    proxy.stop()
    for r in replicas:
        r.stop()


def test_replicas_behind_a_proxy_lose_no_accepted_update_when_one_is_killed_and_publish_what_one_server_does(
    fleet: Any, server_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas, proxy, db = fleet
    manifest = read_manifest(server_artifacts)
    rng = random.Random(55)
    enroller = ProtocolClient(proxy.url)
    enrolled = [enroller.enroll(ENROLL) for _ in range(DEVICES)]
    enroller.close()
    ids, tokens = [e[0] for e in enrolled], [e[1] for e in enrolled]
    kills: list[str] = []
    for trial in range(TRIALS):
        number = db.rounds.latest().round  # type: ignore[union-attr]
        with ThreadPoolExecutor(DEVICES + 1) as pool:
            killer = pool.submit(
                _disrupt, replicas, db, number, ("kill", "kill closer", "pause closer")[trial % 3], rng
            )
            outcomes = pool.map(lambda d: _take_part(proxy.url, tokens[d], d, manifest), range(DEVICES))
            told = dict(enumerate(outcomes))
            kills.append(killer.result())
        deadline = time.monotonic() + 60
        while db.rounds.get(number).state == RoundState.OPEN and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.05)
        ended = db.rounds.get(number)
        assert ended is not None and ended.state == RoundState.CLOSED, (trial, kills, ended)
        recorded = {u.device_id for u in db.rounds.updates(number)}
        accepted = {ids[d] for d, (r, outcome) in told.items() if outcome == "accepted" and r == number}
        assert accepted <= recorded, (trial, kills[-1], told)
    # One server on SQLite, given each round's accepted updates, publishes the same bytes.
    for name in ("FEDPER_ADMIN_TOKEN", "FEDPER_ENROLLMENT_KEY"):
        monkeypatch.setenv(name, "reference-secret-0123456789abcdefghijklmnop")
    from fedper.server.config import ServerConfig
    from fedper.server.state import open_state

    one = open_state(ServerConfig(artifacts=server_artifacts, data_dir=tmp_path / "one", target_clients=1000,
                                  min_clients=1, round_timeout=0), FakeClock())  # fmt: skip
    by_id = {device: d for d, device in enumerate(ids)}
    for device in ids:
        one.db.devices.add(device, f"hash-{device}", "test")
    for number in range(1, TRIALS + 1):
        version = db.rounds.get(number).model_version  # type: ignore[union-attr]
        for update in db.rounds.updates(number):
            d = by_id[update.device_id]
            one.rounds.assign(number, update.device_id)
            upload = Upload(_tensors(manifest, d, number), _samples(d), version, {})
            one.rounds.commit(one.rounds.stage(update.device_id, number, upload))
        one.rounds.closing.try_close(number, "the replicas' accepted set")
        ours, theirs = one.db.versions.get(number), db.versions.get(number)
        assert ours is not None and theirs is not None and ours.sha256 == theirs.sha256, (number, kills)
    one.db.close()
    paused = sum(k == "pause closer" for k in kills)
    fenced = sum(r.log.read_text().count('"round_close_fenced"') for r in replicas)
    assert fenced >= min(paused, 1), (kills, fenced)  # a paused closer woke up and published nothing
    print(f"disruptions: {kills}; closes fenced: {fenced}")
