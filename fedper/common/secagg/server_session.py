"""The server's side of one SecAgg+ round: it routes keys and shares, checks every message at the
door, and from the masked inputs and the survivors' answers it computes the sum of the inputs,
and nothing else (docs/SECAGG.md, "To the byte" and "What the server checks").

Stages (Bonawitz et al.'s U1 to U4): devices that advertised keys (U1), that sent shares (U2),
that sent a masked input (U3), that answered the unmasking (U4). Each device in U3 says which of
its neighbours' sealed shares it could not open; it holds, and pairs its masks with, the others.
Where two devices of U3 disagree (one holds the other's shares, the other not: one of them is
hostile or broken), one of them is left out of the sum, so that every pair of masks in the sum
cancels (:meth:`ServerSession.included`). A device in U2 but not in the sum is treated as dropped:
its pairwise masks with the devices that hold its shares are rebuilt from its mask key, put
together from t shares and checked against its advertised public key; a device in the sum has its
self mask rebuilt from t shares of its seed. With more than t answers, wrong shares are found and
corrected (:func:`fedper.common.secagg.shamir.recover`). A secret that cannot be put together
fails the round (``RoundFailedError``), with nothing applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fedper.common.errors import FedperError
from fedper.common.secagg import keys, prg, shamir
from fedper.common.secagg.device_session import SEALED_BYTES, Advertisement, mask_sign, share_index
from fedper.common.secagg.graph import check_threshold, neighbour_graph

REPLAY_WORDS = 1024  # the masked words whose digest recognises a replayed input


class StageError(FedperError, ValueError):
    """A device's message that does not fit the round's stage, or that it sent before."""


class DuplicateMessageError(StageError):
    """The device already sent its part of this stage (a retry whose first answer was lost)."""


class RoundFailedError(FedperError, RuntimeError):
    """The masks cannot be removed (too few devices survived, or their answers do not fit): the
    round applies nothing."""


class ServerSession:
    """One round's cohort (fixed before it starts), its graph and what has come in."""

    def __init__(
        self,
        cohort: Sequence[str],
        neighbours: int,
        threshold: int,
        words: int,
        context: bytes,
        graph: Mapping[str, Sequence[str]] | None = None,
        load_masked: Callable[[str], np.ndarray] | None = None,
    ) -> None:
        """A fresh graph of ``neighbours`` each over ``cohort``, or the ``graph`` given (a stored
        round's, replayed after a restart); ``load_masked``: a device's stored masked input (to
        take it out of the sum again when it is left out)."""
        check_threshold(neighbours, threshold)
        if graph is None:
            self.graph = neighbour_graph(cohort, neighbours)
        else:
            self.graph = {d: frozenset(graph[d]) for d in cohort}
            if any(len(v) != neighbours or d in v for d, v in self.graph.items()):
                raise StageError(f"a stored graph is not {neighbours}-regular")
        self.threshold, self.words, self.context = threshold, words, context
        self._load_masked = load_masked
        self.advertised: dict[str, Advertisement] = {}
        self._keys_seen: set[bytes] = set()
        self.routed: dict[str, dict[str, bytes]] = {}  # receiver -> sender -> ciphertext
        self.shared: set[str] = set()
        self.masked: set[str] = set()
        self.unopened: dict[str, frozenset[str]] = {}  # device in U3 -> senders whose shares it could not open
        self._digests: dict[bytes, str] = {}  # of the masked inputs: the same bytes twice is a replay
        self._sum = np.zeros(words, dtype=np.uint32)  # of the masked inputs so far: none is kept
        self.answers: dict[str, dict[str, bytes]] = {}
        self._answers_about: dict[str, list[tuple[str, bytes]]] = {}  # owner -> (holder, share) answered
        self._indices: dict[str, dict[str, int]] = {}  # owner -> holder -> its share index
        self._included: frozenset[str] | None = None
        self.wrong_shares: dict[str, list[str]] = {}  # device -> holders whose share of its secret was wrong

    def eligible(self, stage: str) -> set[str]:
        """Who may send its part of ``stage``: those who did the stage before (U0 = the cohort);
        for the unmasking, the devices whose inputs are in the sum."""
        if stage == "unmask":
            return set(self.included())
        return {"keys": set(self.graph), "shares": set(self.advertised), "masked": set(self.shared)}[stage]

    def done(self, stage: str) -> set[str]:
        """Who sent its part of ``stage`` (U1 to U4)."""
        return {"keys": set(self.advertised), "shares": set(self.shared), "masked": set(self.masked),
                "unmask": set(self.answers)}[stage]  # fmt: skip

    def sent(self, stage: str, device: str) -> bool:
        """Whether ``device`` sent its part of ``stage`` (:meth:`done` without copying a set)."""
        return device in {"keys": self.advertised, "shares": self.shared, "masked": self.masked,
                          "unmask": self.answers}[stage]  # fmt: skip

    def advertise(self, device: str, advertisement: Advertisement) -> None:
        """Refused: a key that is not a valid public key, the same key twice, or a key some device
        of the round already advertised (a replay: the honest devices would refuse the list)."""
        self._member(device, self.advertised, "advertised its keys")
        for role, key in (("channel", advertisement.channel), ("mask", advertisement.mask)):
            try:
                keys.check_public(key)
            except keys.ChannelError as e:
                raise StageError(f"{device!r}'s {role} key: {e}") from e
        if advertisement.channel == advertisement.mask:
            raise StageError(f"{device!r}'s channel key and mask key are the same")
        if {advertisement.channel, advertisement.mask} & self._keys_seen:
            raise StageError(f"{device!r} advertised a key another device of the round advertised")
        self.advertised[device] = advertisement
        self._keys_seen |= {advertisement.channel, advertisement.mask}

    def neighbours(self, device: str) -> dict[str, Advertisement]:
        """The keys of the device's neighbours that advertised (after the advertising stage)."""
        return {n: self.advertised[n] for n in sorted(self.graph[device]) if n in self.advertised}

    def share(self, device: str, ciphertexts: Mapping[str, bytes]) -> None:
        """Refused: not one sealed message for each advertised neighbour, or one of another size."""
        self._member(device, self.shared, "sent its shares")
        if device not in self.advertised or set(ciphertexts) != set(self.neighbours(device)):
            raise StageError(f"{device!r} must send one share to each advertised neighbour")
        for receiver, ciphertext in ciphertexts.items():
            if len(ciphertext) != SEALED_BYTES:
                raise StageError(f"a sealed share is {SEALED_BYTES} bytes; {device!r}'s for {receiver!r} is "
                                 f"{len(ciphertext)}")  # fmt: skip
        for receiver, ciphertext in ciphertexts.items():
            self.routed.setdefault(receiver, {})[device] = ciphertext
        self.shared.add(device)

    def shares_for(self, device: str) -> dict[str, bytes]:
        return dict(self.routed.get(device, {}))

    def submit(self, device: str, masked: np.ndarray, unopened: Sequence[str] = ()) -> None:
        """Refused: a device that sent no shares, an input of the wrong size or one already sent
        by another device (a replay), or ``unopened`` naming a device whose shares it was not sent."""
        self._member(device, self.masked, "sent its masked input")
        if device not in self.shared:
            raise StageError(f"{device!r} sent no shares, so it has no masked input in this round")
        if masked.dtype != np.uint32 or masked.shape != (self.words,):
            raise StageError(f"a masked input is {self.words} uint32 words, got {masked.dtype} {masked.shape}")
        if stray := set(unopened) - set(self.shares_for(device)):
            raise StageError(f"{device!r} says it could not open shares of {sorted(stray)}, which it was not sent")
        # A replay is byte for byte another input, whose words are uniform: their first 4 KiB
        # tell it apart as surely as all of them, at a thousandth of the hashing.
        digest = hashlib.sha256(masked[:REPLAY_WORDS].astype("<u4").tobytes()).digest()
        if digest in self._digests:
            raise StageError(f"{device!r}'s masked input is {self._digests[digest]!r}'s, byte for byte")
        self._digests[digest] = device
        self._sum += masked  # wraps mod 2^32
        self.masked.add(device)
        self.unopened[device] = frozenset(unopened)
        self._included = None

    def held(self, device: str) -> set[str]:
        """The neighbours whose shares the device holds (and whose pairwise masks it added)."""
        return set(self.shares_for(device)) - self.unopened.get(device, frozenset())

    def included(self) -> frozenset[str]:
        """The devices of U3 whose inputs are in the sum. Two rules, applied until neither
        leaves anyone else out: while two of them disagree about holding each other's shares, the
        one in the most such disagreements goes (ties: the larger id), so a device that lies
        about, or seals garbage for, several neighbours goes, and one hostile device can leave out
        at most one honest neighbour this way; and when a device out of the sum has fewer than t
        holders of its shares in it (it gave usable shares to too few), those holders go: their
        masks with it could not be removed. Only valid once the masked stage is over."""
        if self._included is None:
            inside = set(self.masked)
            held = {d: self.held(d) for d in inside}
            while True:
                count: dict[str, int] = {}
                for s in inside:
                    for x in self.graph[s] & inside:
                        if s < x and (x in held[s]) != (s in held[x]):
                            count[s] = count.get(s, 0) + 1
                            count[x] = count.get(x, 0) + 1
                if count:
                    inside.discard(max(count, key=lambda d: (count[d], d)))
                    continue
                stranded = set()
                for gone in self.shared - inside:
                    holders = {s for s in inside if gone in held[s]}
                    if 0 < len(holders) < self.threshold:
                        stranded |= holders
                if not stranded:
                    break
                inside -= stranded
            self._included = frozenset(inside)
        return self._included

    def left_out(self) -> set[str]:
        """Devices that sent a masked input that is not in the sum."""
        return self.masked - self.included()

    def unmask_request(self, device: str) -> tuple[list[str], list[str]]:
        """(dropped, survivors) among the neighbours whose shares the device holds: those out of the
        sum (dropped, or left out) and those in it."""
        held, inside = self.held(device), self.included()
        return sorted(held - inside), sorted(held & inside)

    def expected_index(self, owner: str, holder: str) -> int:
        """The holder's share index of the owner's secrets (asked only once the key stage is over,
        when who advertised no longer changes)."""
        if owner not in self._indices:
            self._indices[owner] = {h: share_index(list(self.neighbours(owner)), h) for h in self.neighbours(owner)}
        return self._indices[owner][holder]

    def answer(self, device: str, shares: Mapping[str, bytes]) -> None:
        """Refused: not in the sum, not exactly the devices asked about, or a share that is not
        the device's own (its index) or not a field element."""
        self._member(device, self.answers, "answered the unmasking")
        dropped, survivors = self.unmask_request(device)
        if device not in self.included() or set(shares) != set(dropped) | set(survivors):
            raise StageError(f"{device!r} must answer for exactly the devices it was asked about")
        for about, share in shares.items():
            try:
                parsed = shamir.Share.from_bytes(share)
            except shamir.ShamirError as e:
                raise StageError(f"{device!r}'s share for {about!r}: {e}") from e
            if parsed.index != self.expected_index(about, device):
                raise StageError(f"{device!r}'s share for {about!r} has index {parsed.index}, not its own "
                                 f"({self.expected_index(about, device)})")  # fmt: skip
        self.answers[device] = dict(shares)
        for about, share in shares.items():
            self._answers_about.setdefault(about, []).append((device, share))

    def total(self) -> np.ndarray:
        """The sum of the included inputs, mod 2^32."""
        inside = self.included()
        if not inside:
            raise RoundFailedError("no device's masked input is in the sum")
        total = self._sum.copy()
        for device in sorted(self.left_out()):
            if self._load_masked is None:
                raise RoundFailedError(f"{device!r}'s input must leave the sum but cannot be read again")
            total -= self._load_masked(device)
        for survivor in sorted(inside):
            total -= prg.expand(self._secret(survivor), self.words)
        held = {s: self.held(s) for s in inside}
        for gone in sorted(self.shared - inside):
            holders = sorted(s for s in inside if gone in held[s])
            if not holders:
                continue  # no device in the sum added a mask with it
            key = keys.private_key(self._secret(gone))
            if keys.public_bytes(key) != self.advertised[gone].mask:
                raise RoundFailedError(f"the mask key put together for {gone!r} is not the one it advertised")
            for survivor in holders:
                seed = keys.agree(key, self.advertised[survivor].mask, keys.MASK, self.context)
                mask = prg.expand(seed, self.words)
                total = total - mask if mask_sign(survivor, gone) > 0 else total + mask
        return total

    def _secret(self, device: str) -> bytes:
        """A survivor's seed or a gone device's mask key, from its neighbours' answers (wrong
        shares corrected where there are enough answers, their holders recorded)."""
        given = sorted(self._answers_about.get(device, []))
        kind = "seed" if device in self.included() else "mask key"
        if len(given) < self.threshold:
            raise RoundFailedError(f"{len(given)} of {device!r}'s neighbours answered for its {kind}; "
                                   f"it needs {self.threshold}")  # fmt: skip
        shares = [shamir.Share.from_bytes(share) for _, share in given]
        try:
            secret, wrong = shamir.recover(shares, self.threshold)
        except shamir.ShamirError as e:
            raise RoundFailedError(f"{device!r}'s {kind} cannot be put together from {len(given)} answers: {e}") from e
        if wrong:
            by_index = {s.index: holder for (holder, _), s in zip(given, shares, strict=True)}
            self.wrong_shares[device] = sorted(by_index[i] for i in wrong)
        return secret

    def _member(self, device: str, stage: Mapping[str, object] | set[str], what: str) -> None:
        if device not in self.graph:
            raise StageError(f"{device!r} is not in this round's cohort")
        if device in stage:
            raise DuplicateMessageError(f"{device!r} already {what}")
