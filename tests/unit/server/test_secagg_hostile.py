"""One hostile device in a secure round (issue 49): each finding as a test. The round publishes the
honest devices' result (within the documented bound) or is abandoned with its reason recorded, and
the next round opens and publishes; no answer is a 5xx. In process, over the routes, on a test's
clock (tests/support/secure_round_driver.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedper.common.manifest import Manifest
from fedper.common.protocol import ErrorCode
from fedper.common.secagg import keys, shamir
from tests.support.secure_round_driver import CAN, STAGE, WINDOW, Scene, SecureRoundDriver, b64
from tests.support.server_support import InProcessServer, round_info

pytestmark = pytest.mark.usefixtures("server_secrets")


@pytest.fixture
def scene(server_artifacts: Path, server_manifest: Manifest, tmp_path: Path) -> Iterator[Scene]:
    s = Scene(server_artifacts, server_manifest, tmp_path / "data")
    yield s
    s.server.__exit__(None, None, None)


@pytest.fixture
def dp_scene(server_artifacts: Path, server_manifest: Manifest, tmp_path: Path) -> Iterator[Scene]:
    s = Scene(server_artifacts, server_manifest, tmp_path / "data", dp=True, dp_noise_multiplier=0.0,
              dp_clip=1.0, dp_count_stddev=1.0, dp_sampling_probability=1.0)  # fmt: skip
    yield s
    s.server.__exit__(None, None, None)


def _refused(response: object, code: str = ErrorCode.BAD_SECAGG_MESSAGE) -> None:
    r = response
    assert r.status_code == 422 and r.json()["code"] == code, r.text  # type: ignore[attr-defined]


# --- the key stage --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    ["another device's keys", "channel key = mask key", "all-zero (low-order) key", "non-canonical key"],
)
def test_keys_that_would_stop_the_round_are_refused_at_the_door_and_the_round_closes(scene: Scene, attack: str) -> None:
    d = scene.round()
    victim = scene.honest[0]
    assert d.post_keys(victim).status_code == 202
    a = d.sessions[scene.hostile].advertise()
    own = {"channel_key": b64(a.channel), "mask_key": b64(a.mask)}
    body = {
        "another device's keys": {"channel_key": b64(d.sessions[victim].advertise().channel),
                                  "mask_key": b64(d.sessions[victim].advertise().mask)},
        "channel key = mask key": {"channel_key": own["mask_key"], "mask_key": own["mask_key"]},
        "all-zero (low-order) key": {"channel_key": b64(bytes(32)), "mask_key": own["mask_key"]},
        "non-canonical key": {"channel_key": own["channel_key"], "mask_key": b64((2**255 - 10).to_bytes(32, "little"))},
    }[attack]  # fmt: skip
    _refused(d.post_keys(scene.hostile, body))
    assert not [m for m in scene.server.state.db.secagg.messages(d.number) if m[1] == scene.hostile]  # type: ignore[union-attr]
    d.honest_round([*scene.honest[1:], victim], scene.deltas, scene.samples)
    d.wait_out("unmask")
    scene.tick()
    scene.assert_published(d.number, 1, scene.honest)  # the hostile device missed the key stage: out


def test_empty_or_misshapen_sealed_shares_are_refused_at_the_door(scene: Scene) -> None:
    d = scene.round()
    for device, _ in scene.devices:
        assert d.post_keys(device).status_code == 202
    d.wait_out("keys")
    sealed = d.honest_shares(scene.hostile)
    for bad in (
        {m: b"" for m in sealed},
        {m: c[:-1] for m, c in sealed.items()},
        {m: c + b"\x00" for m, c in sealed.items()},
    ):
        _refused(d.post_shares(scene.hostile, bad))


def test_shares_sealed_to_the_wrong_peers_leave_the_hostile_device_out_and_the_round_closes(scene: Scene) -> None:
    """Its sealed messages are the right size but do not open for their receivers: each receiver
    holds none of its shares and says so; the hostile device is left out of the sum."""
    d = scene.round()
    for device, _ in scene.devices:
        assert d.post_keys(device).status_code == 202
    d.wait_out("keys")
    sealed = d.honest_shares(scene.hostile)
    receivers = sorted(sealed)
    swapped = {m: sealed[receivers[(i + 1) % len(receivers)]] for i, m in enumerate(receivers)}  # each to another
    assert d.post_shares(scene.hostile, swapped).status_code == 202
    for h in scene.honest:
        assert d.post_shares(h).status_code == 202
    d.wait_out("shares")
    for h in scene.honest:
        d.fetch_shares(h)
        assert d.sessions[h].unopened == [scene.hostile]
    d.fetch_shares(scene.hostile)
    for device in [*scene.honest, scene.hostile]:
        assert d.post_masked(device, d.words(scene.deltas[device], scene.samples[device])).status_code == 202
    d.wait_out("masked")
    r = d.fetch_unmask(scene.hostile)
    assert r.status_code == 409 and r.json()["code"] == ErrorCode.SECAGG_STAGE_CLOSED  # left out of the sum
    for h in scene.honest:
        assert d.post_unmask(h).status_code == 202
    scene.tick()
    scene.assert_published(d.number, 1, scene.honest)


# --- the masked stage -------------------------------------------------------------------------


def _to_masked_stage(scene: Scene, d: SecureRoundDriver | None = None) -> SecureRoundDriver:
    """Every device's keys and shares (the round begun unless ``d`` is given), each device holding
    what it was sent: the masked stage is open."""
    d = scene.round() if d is None else d
    for device, _ in scene.devices:
        assert d.post_keys(device).status_code == 202
    d.wait_out("keys")
    for device, _ in scene.devices:
        assert d.post_shares(device).status_code == 202
    d.wait_out("shares")
    for device, _ in scene.devices:
        d.fetch_shares(device)
    return d


def _finish(scene: Scene, d: SecureRoundDriver) -> None:
    for h in scene.honest:
        assert d.post_masked(h, d.words(scene.deltas[h], scene.samples[h])).status_code == 202
    d.wait_out("masked")
    for device, _ in scene.devices:
        r = d.post_unmask(device)
        assert r.status_code < 500, r.text
    d.wait_out("unmask")
    scene.tick()


@pytest.mark.parametrize(
    "attack",
    ["a negative weight and a chosen offset", "every delta word at the clamp", "a weight above the cap"],
)
def test_a_masked_input_no_honest_device_could_send_is_not_published(scene: Scene, attack: str) -> None:
    d = _to_masked_stage(scene)
    fixed = d.fixed()
    words = fixed.encode(np.zeros(scene.words), 100).astype(np.int64)
    if attack == "a negative weight and a chosen offset":
        words[:100] = 3 * fixed.bound
        words[-1] = -90
    elif attack == "every delta word at the clamp":
        words[:-1] = fixed.bound
    else:
        words[-1] = 10 * fixed.weight_cap
    assert d.post_masked(scene.hostile, words.astype(np.uint32)).status_code == 202  # masked: unreadable at the door
    _finish(scene, d)
    scene.assert_abandoned(d.number, "secure round failed: ")
    scene.next_round_publishes(0)


def test_a_replayed_masked_input_is_refused_at_the_door(scene: Scene) -> None:
    d = _to_masked_stage(scene)
    victim = scene.honest[0]
    raw = d.sessions[victim].masked_input(d.words(scene.deltas[victim], scene.samples[victim])).astype("<u4").tobytes()
    assert d.post_masked(victim, raw=raw).status_code == 202
    _refused(d.post_masked(scene.hostile, raw=raw))
    for h in scene.honest[1:]:
        assert d.post_masked(h, d.words(scene.deltas[h], scene.samples[h])).status_code == 202
    d.wait_out("masked")
    for device, _ in scene.devices:
        d.post_unmask(device)
    scene.tick()
    scene.assert_published(d.number, 1, scene.honest)


def test_false_complaints_leave_out_at_most_the_complainer(scene: Scene) -> None:
    """The hostile device says it could not open any neighbour's shares: it is in every
    disagreement, so it alone leaves the sum."""
    d = _to_masked_stage(scene)
    words = d.words(scene.deltas[scene.hostile], scene.samples[scene.hostile])
    assert d.post_masked(scene.hostile, words, unopened=scene.honest).status_code == 202
    _finish(scene, d)
    scene.assert_published(d.number, 1, scene.honest)


# --- the unmasking ---------------------------------------------------------------------------


def test_an_answer_with_another_holders_share_index_is_refused_at_the_door(scene: Scene) -> None:
    d = _to_masked_stage(scene)
    assert (
        d.post_masked(scene.hostile, d.words(scene.deltas[scene.hostile], scene.samples[scene.hostile])).status_code
        == 202
    )
    for h in scene.honest:
        assert d.post_masked(h, d.words(scene.deltas[h], scene.samples[h])).status_code == 202
    d.wait_out("masked")
    request = d.fetch_unmask(scene.hostile).json()
    honest_answer = d.sessions[scene.hostile].unmask(request["dropped"], request["survivors"])
    moved = {}
    for about, share in honest_answer.items():
        parsed = shamir.Share.from_bytes(share)
        moved[about] = shamir.Share(parsed.index % 5 + 1, parsed.value).to_bytes()  # another holder's index
    _refused(d.post_unmask(scene.hostile, moved))
    for h in scene.honest:
        assert d.post_unmask(h).status_code == 202
    d.wait_out("unmask")
    scene.tick()
    scene.assert_published(d.number, 1, [*scene.honest, scene.hostile])  # its honest input is in the sum


@pytest.mark.parametrize("values", ["shifted", "random"])
def test_wrong_share_values_are_corrected_and_their_holder_named(
    scene: Scene, values: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Five answers for each secret, t = 3: one wrong share is found and corrected."""
    d = _to_masked_stage(scene)
    for device, _ in scene.devices:
        assert d.post_masked(device, d.words(scene.deltas[device], scene.samples[device])).status_code == 202
    d.wait_out("masked")
    request = d.fetch_unmask(scene.hostile).json()
    answer = d.sessions[scene.hostile].unmask(request["dropped"], request["survivors"])
    rng = np.random.default_rng(3)
    lying = {}
    for about, share in answer.items():
        s = shamir.Share.from_bytes(share)
        value = (s.value + 1) % shamir.PRIME if values == "shifted" else int(rng.integers(0, 2**62)) * 2**400
        lying[about] = shamir.Share(s.index, value).to_bytes()
    assert d.post_unmask(scene.hostile, lying).status_code == 202  # a share's value cannot be checked at the door
    for h in scene.honest:
        assert d.post_unmask(h).status_code == 202
    scene.tick()
    scene.assert_published(d.number, 1, [*scene.honest, scene.hostile])
    named = [json.loads(r.message) for r in caplog.records if "secure_round_devices" in r.message]
    assert named and all(v == [scene.hostile] for v in named[0]["wrong_shares"].values()), named


def test_a_round_whose_secret_cannot_be_put_together_is_abandoned_with_its_reason_and_stays_so(
    scene: Scene,
) -> None:
    """Four of six drop after sharing; the two left cannot put any secret together (t = 3): the
    round is abandoned with its reason, a restart does not meet the failure again, the next round
    publishes."""
    d = _to_masked_stage(scene)
    for h in scene.honest[:2]:
        assert d.post_masked(h, d.words(scene.deltas[h], scene.samples[h])).status_code == 202
    d.wait_out("masked")
    for h in scene.honest[:2]:
        d.post_unmask(h)
    d.wait_out("unmask")
    scene.tick()
    scene.assert_abandoned(d.number, "no device's masked input is in the sum")
    scene.restart()
    scene.tick()
    scene.assert_abandoned(d.number, "no device's masked input is in the sum")
    scene.next_round_publishes(0)


def test_a_post_before_its_stage_is_told_when_to_come_back_and_received_counts_masked_inputs(scene: Scene) -> None:
    d = scene.round()
    early = d.post_shares(scene.honest[0], {})
    assert early.status_code == 409 and early.json()["code"] == ErrorCode.SECAGG_STAGE_NOT_OPEN, early.text
    assert 1 <= int(early.headers["Retry-After"]) <= STAGE + 1
    d = _to_masked_stage(scene, d)
    for h in scene.honest[:3]:
        assert d.post_masked(h, d.words(scene.deltas[h], scene.samples[h])).status_code == 202
    assert round_info(scene.server.http, d.number)["received"] == 3


# --- with DP-FedAvg --------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["weight 2^31", "unclipped count 2^31 - 1"])
def test_a_dp_secure_round_with_a_huge_word_never_wedges_the_server_nor_zeroes_the_clip(
    dp_scene: Scene, word: str
) -> None:
    """A weight word no honest device sends (each weighs 1) abandons the round: that depends on
    no honest device's data. A huge unclipped count does not: whether a noised round is published
    must not depend on the honest bits, so the count is clamped to what the sampling allows and
    the round is published, the next clip within its bounds."""
    scene = dp_scene
    d = _to_masked_stage(scene)
    words = d.words(np.zeros(scene.words), 1, 1).astype(np.int64)
    if word == "weight 2^31":
        words[-1] = 2**31
    else:
        words[-2] = 2**31 - 1
    assert d.post_masked(scene.hostile, words.astype(np.uint32)).status_code == 202
    _finish(scene, d)
    privacy = scene.server.http.get("/v1/status").json()["privacy"]
    if word == "weight 2^31":
        scene.assert_abandoned(d.number, "the total weight 2147483653 is outside [6, 6]")
        assert privacy["clip_norm"] == 1.0 and privacy["rounds"] == 0  # nothing was noised or released
    else:
        assert round_info(scene.server.http, d.number)["state"] == "closed"
        assert privacy["rounds"] == 1 and 0.5 < privacy["clip_norm"] < 1.0  # moved by one bounded step, not to 0
    r = scene.server.http.get("/v1/task", headers=scene.devices[0][1])
    assert r.status_code in (200, 204, 403), r.text  # never a 500


def test_a_stored_clip_that_is_not_a_positive_number_is_refused_not_a_500(dp_scene: Scene) -> None:
    """What a server before revision 1.7 could persist (the finding: next clip 0.0, every task a 500)."""
    scene = dp_scene
    state = scene.server.state
    assert state is not None
    with state.db.transaction() as tx:
        state.db.set_dp_state(tx, replace(state.db.dp_state(), clip=0.0))
    scene.restart()
    for _, headers in scene.devices:  # check in; after the window the drawn devices get their tasks
        assert scene.server.http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
    scene.clock.now += WINDOW
    r = scene.server.http.get("/v1/task", headers={**scene.devices[0][1], **CAN})
    assert r.status_code == 200, r.text  # it was a 500: the task could not carry a clip of 0
    assert r.json()["dp"]["clip_norm"] == 1.0 and r.json()["secagg"]["clip_norm"] == 1.0
    assert scene.server.http.get("/v1/status").json()["privacy"]["clip_norm"] == 1.0


def test_a_key_is_checked_as_devices_check_it() -> None:
    """The door's check is the devices' own (keys.check_public), on the vectors' refused keys."""
    vectors = json.loads((Path(__file__).resolve().parents[3] / "docs" / "secagg_vectors.json").read_text())
    for case in vectors["keys"]["invalid_public_keys"]:
        with pytest.raises(keys.ChannelError):
            keys.check_public(bytes.fromhex(case["key"]))
    for pair in vectors["keys"]["pairs"]:
        keys.check_public(bytes.fromhex(pair["public"]))


def test_a_session_that_no_longer_replays_abandons_its_round_not_a_500(scene: Scene) -> None:
    """A masked input's file lost from the disk while the server was down: the next request that
    needs the session is told the round is not open, the round is abandoned with its reason, and
    the next round publishes."""
    d = _to_masked_stage(scene)
    for device, _ in scene.devices:
        assert d.post_masked(device, d.words(scene.deltas[device], scene.samples[device])).status_code == 202
    d.wait_out("masked")
    scene.server.__exit__(None, None, None)
    next(scene.data.rglob("*.masked")).unlink()
    scene.server = InProcessServer(scene.artifacts, scene.data, clock=scene.clock, **scene.options).__enter__()
    d.http = scene.server.http
    r = d.fetch_unmask(scene.honest[0])
    assert r.status_code == 409 and r.json()["code"] == ErrorCode.ROUND_NOT_OPEN, r.text
    scene.assert_abandoned(d.number, "does not replay")
    scene.next_round_publishes(0)
