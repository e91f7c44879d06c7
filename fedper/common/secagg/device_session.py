"""A device's side of one SecAgg+ round: keys, shares, the masked input, the unmasking answer
(docs/SECAGG.md, "To the byte", defines every byte of it).

The device trusts the server to route, not to be honest about who dropped: it answers one
unmasking request only, refuses one that names a device both as dropped and as surviving, and
never gives its own secrets away. A neighbour's sealed shares that it cannot open (a hostile or
broken neighbour) do not end its round: it keeps no share of that neighbour, adds no pairwise
mask with it, and says so with its masked input, so that the server leaves the pair out
consistently.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedper.common.errors import FedperError
from fedper.common.secagg import keys, prg, shamir

# The sealed share message: a share of the self-mask seed, then one of the mask key.
PLAINTEXT_BYTES = 2 * shamir.SHARE_BYTES
SEALED_BYTES = keys.sealed_size(PLAINTEXT_BYTES)  # 164


class RequestRefusedError(FedperError, ValueError):
    """What the server asked would break the protocol; the device does not answer it."""


@dataclass(frozen=True)
class Advertisement:
    """A device's two public keys for the round."""

    channel: bytes
    mask: bytes


@dataclass(frozen=True)
class HeldShares:
    """What a neighbour sent this device: a share of its self-mask seed and of its mask key."""

    seed: shamir.Share
    mask_key: shamir.Share


def associated_data(context: bytes, sender: str, receiver: str) -> bytes:
    """What a sealed share is bound to: the round, who sealed it and for whom."""
    return b"\x00".join((b"fedper secagg share", context, sender.encode("ascii"), receiver.encode("ascii")))


def pack(held: HeldShares) -> bytes:
    return held.seed.to_bytes() + held.mask_key.to_bytes()


def unpack(data: bytes) -> HeldShares:
    if len(data) != PLAINTEXT_BYTES:
        raise shamir.ShamirError(f"a share message is {PLAINTEXT_BYTES} bytes, got {len(data)}")
    half = shamir.SHARE_BYTES
    return HeldShares(shamir.Share.from_bytes(data[:half]), shamir.Share.from_bytes(data[half:]))


def share_index(holders: Sequence[str], holder: str) -> int:
    """A holder's share index: its 1-based position among the owner's advertised neighbours, in
    byte order of their ids."""
    return sorted(holders).index(holder) + 1


def check_keys(advertisements: Sequence[Advertisement]) -> None:
    """Every key valid (keys.check_public) and no two keys equal, across both roles."""
    public = [k for a in advertisements for k in (a.channel, a.mask)]
    for key in public:
        keys.check_public(key)
    if len(set(public)) != len(public):
        raise keys.ChannelError("two keys of the round are the same")


def mask_sign(owner: str, other: str) -> int:
    """The pairwise mask is added by the smaller id (in byte order) and subtracted by the larger."""
    return 1 if owner < other else -1


class DeviceSession:
    """One device in one round (``context`` names the round: the keys it derives are for it only)."""

    def __init__(
        self,
        device_id: str,
        context: bytes,
        key_pairs: keys.KeyPairs | None = None,
        seed: bytes | None = None,
        randbelow: Callable[[int], int] = secrets.randbelow,
        nonce: Callable[[int], bytes] = os.urandom,
    ) -> None:
        """Fresh keys, seed and randomness unless given (given only by the known-answer vectors)."""
        self.device_id, self.context = device_id, context
        self._keys = key_pairs or keys.KeyPairs.generate()
        self._seed = os.urandom(prg.SEED_BYTES) if seed is None else seed
        self._randbelow, self._nonce = randbelow, nonce
        self._neighbours: dict[str, Advertisement] = {}
        self._threshold = 0
        self._held: dict[str, HeldShares] = {}
        self.unopened: list[str] = []  # neighbours whose sealed shares did not open
        self._answered: tuple[frozenset[str], frozenset[str]] | None = None

    def advertise(self) -> Advertisement:
        channel, mask = self._keys.public()
        return Advertisement(channel, mask)

    def share_keys(self, neighbours: Mapping[str, Advertisement], threshold: int) -> dict[str, bytes]:
        """Shares of the self-mask seed and the mask key, one per neighbour, each sealed for it.
        Refused: a list that names this device, too short for the threshold or with 2t <= k (a
        server lying about who dropped could then collect both secrets), or with a key that is
        invalid or repeated (only a server that does not check keys could send one)."""
        if self.device_id in neighbours:
            raise RequestRefusedError("the server listed this device as its own neighbour")
        if len(neighbours) < threshold or threshold < 1:
            raise RequestRefusedError(f"{len(neighbours)} neighbours cannot hold shares {threshold} of n")
        if 2 * threshold <= len(neighbours):  # else a lying server could collect t shares of both secrets
            raise RequestRefusedError(f"a threshold of {threshold} among {len(neighbours)} neighbours is not more "
                                      "than half: the server could collect both secrets")  # fmt: skip
        try:
            check_keys([*neighbours.values(), self.advertise()])
        except keys.ChannelError as e:
            raise RequestRefusedError(f"the key list: {e}") from e
        self._neighbours, self._threshold = dict(neighbours), threshold
        order = sorted(neighbours)
        seed_shares = shamir.split(self._seed, threshold, len(order), self._randbelow)
        key_shares = shamir.split(keys.private_bytes(self._keys.mask), threshold, len(order), self._randbelow)
        out = {}
        for name, seed_share, key_share in zip(order, seed_shares, key_shares, strict=True):
            key = keys.agree(self._keys.channel, neighbours[name].channel, keys.CHANNEL, self.context)
            sealed = pack(HeldShares(seed_share, key_share))
            out[name] = keys.encrypt(key, sealed, associated_data(self.context, self.device_id, name), self._nonce)
        return out

    def receive_shares(self, ciphertexts: Mapping[str, bytes]) -> None:
        """Keep the shares the neighbours sealed for this device; one that does not open, is not
        136 bytes, holds a share out of the field or two shares of different indices is left out
        and listed in ``unopened``. Refused: shares from a device that is not a neighbour, or fewer
        usable than the threshold."""
        for sender in sorted(ciphertexts):
            if sender not in self._neighbours:
                raise RequestRefusedError(f"shares from {sender!r}, who is not a neighbour")
            try:
                key = keys.agree(self._keys.channel, self._neighbours[sender].channel, keys.CHANNEL, self.context)
                plain = keys.decrypt(key, ciphertexts[sender], associated_data(self.context, sender, self.device_id))
                held = unpack(plain)
                if held.seed.index != held.mask_key.index:
                    raise shamir.ShamirError("the two shares have different indices")
            except (keys.ChannelError, shamir.ShamirError):
                self.unopened.append(sender)
                continue
            self._held[sender] = held
        if len(self._held) < self._threshold:
            raise RequestRefusedError(
                f"only {len(self._held)} neighbours sent shares that open; the round needs {self._threshold}"
            )

    def masked_input(self, words: np.ndarray) -> np.ndarray:
        """The words (uint32) plus the self mask and the pairwise masks with the neighbours whose
        shares it holds, mod 2^32."""
        masked = np.asarray(words, dtype=np.uint32) + prg.expand(self._seed, len(words))
        for other in sorted(self._held):
            seed = keys.agree(self._keys.mask, self._neighbours[other].mask, keys.MASK, self.context)
            mask = prg.expand(seed, len(words))
            masked = masked + mask if mask_sign(self.device_id, other) > 0 else masked - mask
        return masked.astype(np.uint32)

    def unmask(self, dropped: Sequence[str], survivors: Sequence[str]) -> dict[str, bytes]:
        """The mask-key shares of the dropped neighbours and the seed shares of the surviving ones.
        Refused: a device named twice or as both, one it holds no share of, or a second, different
        request."""
        if len(set(dropped)) != len(dropped) or len(set(survivors)) != len(survivors):
            raise RequestRefusedError("the unmasking request names a device twice")
        request = frozenset(dropped), frozenset(survivors)
        if both := request[0] & request[1]:
            raise RequestRefusedError(f"asked for both secrets of {sorted(both)}")
        if unknown := (request[0] | request[1]) - self._held.keys():
            raise RequestRefusedError(f"asked about {sorted(unknown)}, of whom this device holds no share")
        if self._answered is not None and self._answered != request:
            raise RequestRefusedError("the round's unmasking was already answered with other lists")
        self._answered = request
        answer = {d: self._held[d].mask_key.to_bytes() for d in request[0]}
        answer.update({s: self._held[s].seed.to_bytes() for s in request[1]})
        return answer
