"""A device's side of one SecAgg+ round: keys, shares, the masked input, the unmasking answer.

The device trusts the server to route, not to be honest about who dropped: it answers one
unmasking request only, refuses one that names a device both as dropped and as surviving, and
never gives its own secrets away.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedper.common.errors import FedperError
from fedper.common.secagg import keys, prg, shamir


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


def _associated(context: bytes, sender: str, receiver: str) -> bytes:
    return b"|".join((context, sender.encode(), receiver.encode()))


def _pack(sender: str, receiver: str, held: HeldShares) -> bytes:
    ids = f"{sender}\n{receiver}\n".encode()
    return len(ids).to_bytes(2, "big") + ids + held.seed.to_bytes() + held.mask_key.to_bytes()


def _unpack(data: bytes) -> tuple[str, str, HeldShares]:
    size = int.from_bytes(data[:2], "big")
    ids, rest = data[2 : 2 + size].decode().split("\n"), data[2 + size :]
    if len(ids) != 3 or len(rest) != 2 * shamir.SHARE_BYTES:
        raise RequestRefusedError("a share message is malformed")
    half = shamir.SHARE_BYTES
    return ids[0], ids[1], HeldShares(shamir.Share.from_bytes(rest[:half]), shamir.Share.from_bytes(rest[half:]))


def mask_sign(owner: str, other: str) -> int:
    """The pairwise mask is added by the smaller id and subtracted by the larger."""
    return 1 if owner < other else -1


class DeviceSession:
    """One device in one round (``context`` names the round: the keys it derives are for it only)."""

    def __init__(
        self, device_id: str, context: bytes, key_pairs: keys.KeyPairs | None = None, seed: bytes | None = None
    ) -> None:
        """Fresh keys and seed unless given (given only by the cross-language tests)."""
        self.device_id, self.context = device_id, context
        self._keys = key_pairs or keys.KeyPairs.generate()
        self._seed = os.urandom(prg.SEED_BYTES) if seed is None else seed
        self._neighbours: dict[str, Advertisement] = {}
        self._threshold = 0
        self._held: dict[str, HeldShares] = {}
        self._answered: tuple[frozenset[str], frozenset[str]] | None = None

    def advertise(self) -> Advertisement:
        channel, mask = self._keys.public()
        return Advertisement(channel, mask)

    def share_keys(self, neighbours: Mapping[str, Advertisement], threshold: int) -> dict[str, bytes]:
        """Shares of the self-mask seed and the mask key, one per neighbour, each encrypted for it."""
        if self.device_id in neighbours:
            raise RequestRefusedError("the server listed this device as its own neighbour")
        if len(neighbours) < threshold or threshold < 1:
            raise RequestRefusedError(f"{len(neighbours)} neighbours cannot hold shares {threshold} of n")
        own = self.advertise()
        public = [k for a in neighbours.values() for k in (a.channel, a.mask)] + [own.channel, own.mask]
        if len(set(public)) != len(public):
            raise RequestRefusedError("two devices advertised the same public key")
        self._neighbours, self._threshold = dict(neighbours), threshold
        order = sorted(neighbours)
        seed_shares = shamir.split(self._seed, threshold, len(order))
        key_shares = shamir.split(keys.private_bytes(self._keys.mask), threshold, len(order))
        out = {}
        for name, seed_share, key_share in zip(order, seed_shares, key_shares, strict=True):
            key = keys.agree(self._keys.channel, neighbours[name].channel, keys.CHANNEL, self.context)
            message = _pack(self.device_id, name, HeldShares(seed_share, key_share))
            out[name] = keys.encrypt(key, message, _associated(self.context, self.device_id, name))
        return out

    def receive_shares(self, ciphertexts: Mapping[str, bytes]) -> None:
        """Keep the shares the neighbours sent (those who did not send are out of the round)."""
        for sender, ciphertext in ciphertexts.items():
            if sender not in self._neighbours:
                raise RequestRefusedError(f"shares from {sender!r}, who is not a neighbour")
            key = keys.agree(self._keys.channel, self._neighbours[sender].channel, keys.CHANNEL, self.context)
            plain = keys.decrypt(key, ciphertext, _associated(self.context, sender, self.device_id))
            claimed_sender, receiver, held = _unpack(plain)
            if (claimed_sender, receiver) != (sender, self.device_id):
                raise RequestRefusedError(f"a share message from {sender!r} names {claimed_sender!r} to {receiver!r}")
            self._held[sender] = held
        if len(self._held) < self._threshold:
            raise RequestRefusedError(
                f"only {len(self._held)} neighbours sent shares; the round needs {self._threshold}"
            )

    def masked_input(self, words: np.ndarray) -> np.ndarray:
        """The words (uint32) plus the self mask and the pairwise masks with the neighbours who
        sent shares, mod 2^32."""
        masked = np.asarray(words, dtype=np.uint32) + prg.expand(self._seed, len(words))
        for other in sorted(self._held):
            seed = keys.agree(self._keys.mask, self._neighbours[other].mask, keys.MASK, self.context)
            mask = prg.expand(seed, len(words))
            masked = masked + mask if mask_sign(self.device_id, other) > 0 else masked - mask
        return masked.astype(np.uint32)

    def unmask(self, dropped: Sequence[str], survivors: Sequence[str]) -> dict[str, bytes]:
        """The mask-key shares of the dropped neighbours and the seed shares of the surviving ones.
        Refused: a device named as both, one it holds no share of, or a second, different request."""
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
