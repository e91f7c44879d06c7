"""Issue 28's finding 4, in process (real SQLite, real files, an injected clock): seven sybils
that ask for a task before everyone else took every cohort slot, round after round. With a
check-in window the slots are drawn at random among the devices that checked in, devices
that reported in the previous round last; a participation limit bounds any one device."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from fedper.common.manifest import read_manifest
from fedper.server.state import ServerState
from fedper.server.upload_validation import Upload
from tests.support.server_support import FakeClock, base_like, open_in_process

SYBILS = [f"sybil-{i}" for i in range(7)]
HONEST = [f"honest-{i:02d}" for i in range(20)]
WINDOW = 30.0

pytestmark = pytest.mark.usefixtures("server_secrets")


def _run(artifacts: Path, data: Path, rounds: int, **options: object) -> list[list[str]]:
    """``rounds`` rounds of 27 devices, the sybils always asking first (and again after the
    window, if there is one); every slot holder reports until the round closes at 5. The
    devices that held slots, per round."""
    clock = FakeClock()
    state: ServerState = open_in_process(artifacts, data, clock, target_clients=5, min_clients=1, cohort_size=5,
                                         over_selection=1.4, round_timeout=600, rounds=rounds + 1,
                                         **options)  # fmt: skip
    state.rounds.cohort._rng = random.Random(0)  # the server draws with SystemRandom
    manifest = read_manifest(artifacts)
    try:
        for device in SYBILS + HONEST:
            state.db.devices.add(device, f"hash-{device}", "test")
        held = []
        for number in range(1, rounds + 1):
            snap = state.rounds.snapshot
            assert snap.round == number
            slots = {d for d in SYBILS + HONEST if state.rounds.assign(number, d) is not None}
            if not slots:  # checked in: ask again once the window has ended
                clock.now = snap.opened_at + WINDOW + 1
                slots = {d for d in SYBILS + HONEST if state.rounds.assign(number, d) is not None}
            held.append(sorted(slots))
            for i, device in enumerate(sorted(slots)[:5]):
                upload = Upload(base_like(manifest, seed=100 * number + i), 10, snap.model_version, {})
                state.rounds.commit(state.rounds.stage(device, number, upload))
            clock.now += 1
        return held
    finally:
        state.db.close()


def test_first_come_lets_seven_sybils_take_every_slot(server_artifacts, tmp_path):
    """The finding, as the server still behaves without a check-in window (the default)."""
    held = _run(server_artifacts, tmp_path / "data", rounds=4)
    assert all(slots == SYBILS for slots in held)


def test_a_check_in_window_draws_the_slots_at_random_and_never_back_to_back(server_artifacts, tmp_path):
    held = _run(server_artifacts, tmp_path / "data", rounds=12, checkin_window=WINDOW)
    assert all(len(slots) == 7 for slots in held)
    sybil_slots = sum(d in SYBILS for slots in held for d in slots)
    print(f"sybils held {sybil_slots} of {sum(len(s) for s in held)} slots in {len(held)} rounds")  # docs/SERVER.md
    assert sybil_slots / sum(len(slots) for slots in held) < 0.5  # 7 of 27 devices: 0.26 expected; first come: 1.0
    counts = Counter(d for slots in held for d in slots)
    assert len(counts) >= 25  # nearly every device has trained
    reported = [set(slots[:5]) for slots in held]  # the first five of each round's slot holders report
    for before, after in zip(reported, held[1:], strict=False):
        assert not before & set(after), "a device that reported held a slot again in the next round"


def test_a_participation_limit_bounds_each_device(server_artifacts, tmp_path):
    held = _run(server_artifacts, tmp_path / "data", rounds=6, max_participation=1, participation_rounds=3)
    reported = [set(slots[:5]) for slots in held]
    for number, slots in enumerate(held):
        for earlier in reported[max(0, number - 3) : number]:
            assert not earlier & set(slots)
    assert set(held[0]) == set(SYBILS)  # first come, still
    assert not set(held[1]) & set(sorted(SYBILS)[:5])  # but the five that reported wait three rounds
