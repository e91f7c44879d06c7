"""The server's side of one SecAgg+ round: it routes keys and shares, and from the masked inputs
and the survivors' answers it computes the sum of the inputs, and nothing else.

Stages (Bonawitz et al.'s U1 to U4): devices that advertised keys (U1), that sent shares (U2),
that sent a masked input (U3), that answered the unmasking (U4). A device in U2 but not U3
dropped: its pairwise masks are rebuilt from its mask key, put together from t shares; a device
in U3 has its self mask rebuilt from t shares of its seed. Too few shares of either fails the
round (``RoundFailedError``), with nothing applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedper.common.errors import FedperError
from fedper.common.secagg import keys, prg, shamir
from fedper.common.secagg.device_session import Advertisement, mask_sign
from fedper.common.secagg.graph import check_threshold, neighbour_graph


class StageError(FedperError, ValueError):
    """A device's message that does not fit the round's stage, or that it sent before."""


class DuplicateMessageError(StageError):
    """The device already sent its part of this stage (a retry whose first answer was lost)."""


class RoundFailedError(FedperError, RuntimeError):
    """Too few devices survived to remove the masks: the round applies nothing."""


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
    ) -> None:
        """A fresh graph of ``neighbours`` each over ``cohort``, or the ``graph`` given (a stored
        round's, replayed after a restart)."""
        check_threshold(neighbours, threshold)
        if graph is None:
            self.graph = neighbour_graph(cohort, neighbours)
        else:
            self.graph = {d: frozenset(graph[d]) for d in cohort}
            if any(len(v) != neighbours or d in v for d, v in self.graph.items()):
                raise StageError(f"a stored graph is not {neighbours}-regular")
        self.threshold, self.words, self.context = threshold, words, context
        self.advertised: dict[str, Advertisement] = {}
        self.routed: dict[str, dict[str, bytes]] = {}  # receiver -> sender -> ciphertext
        self.shared: set[str] = set()
        self.masked: set[str] = set()
        self._sum = np.zeros(words, dtype=np.uint32)  # of the masked inputs so far: none is kept
        self.answers: dict[str, dict[str, bytes]] = {}

    def eligible(self, stage: str) -> set[str]:
        """Who may send its part of ``stage``: those who did the stage before (U0 = the cohort)."""
        return {"keys": set(self.graph), "shares": set(self.advertised), "masked": set(self.shared),
                "unmask": set(self.masked)}[stage]  # fmt: skip

    def done(self, stage: str) -> set[str]:
        """Who sent its part of ``stage`` (U1 to U4)."""
        return {"keys": set(self.advertised), "shares": set(self.shared), "masked": set(self.masked),
                "unmask": set(self.answers)}[stage]  # fmt: skip

    def advertise(self, device: str, advertisement: Advertisement) -> None:
        self._member(device, self.advertised, "advertised its keys")
        if {len(advertisement.channel), len(advertisement.mask)} != {keys.KEY_BYTES}:
            raise StageError(f"{device!r}: an X25519 public key is {keys.KEY_BYTES} bytes")
        self.advertised[device] = advertisement

    def neighbours(self, device: str) -> dict[str, Advertisement]:
        """The keys of the device's neighbours that advertised (after the advertising stage)."""
        return {n: self.advertised[n] for n in sorted(self.graph[device]) if n in self.advertised}

    def share(self, device: str, ciphertexts: Mapping[str, bytes]) -> None:
        self._member(device, self.shared, "sent its shares")
        if device not in self.advertised or set(ciphertexts) != set(self.neighbours(device)):
            raise StageError(f"{device!r} must send one share to each advertised neighbour")
        for receiver, ciphertext in ciphertexts.items():
            self.routed.setdefault(receiver, {})[device] = ciphertext
        self.shared.add(device)

    def shares_for(self, device: str) -> dict[str, bytes]:
        return dict(self.routed.get(device, {}))

    def submit(self, device: str, masked: np.ndarray) -> None:
        self._member(device, self.masked, "sent its masked input")
        if device not in self.shared:
            raise StageError(f"{device!r} sent no shares, so it has no masked input in this round")
        if masked.dtype != np.uint32 or masked.shape != (self.words,):
            raise StageError(f"a masked input is {self.words} uint32 words, got {masked.dtype} {masked.shape}")
        self._sum += masked  # wraps mod 2^32
        self.masked.add(device)

    def unmask_request(self, device: str) -> tuple[list[str], list[str]]:
        """(dropped, survivors) among the neighbours whose shares the device holds."""
        held = [n for n in sorted(self.graph[device]) if n in self.shared]
        return [n for n in held if n not in self.masked], [n for n in held if n in self.masked]

    def answer(self, device: str, shares: Mapping[str, bytes]) -> None:
        self._member(device, self.answers, "answered the unmasking")
        dropped, survivors = self.unmask_request(device)
        if device not in self.masked or set(shares) != set(dropped) | set(survivors):
            raise StageError(f"{device!r} must answer for exactly the devices it was asked about")
        for about, share in shares.items():
            try:
                shamir.Share.from_bytes(share)
            except shamir.ShamirError as e:
                raise StageError(f"{device!r}'s share for {about!r}: {e}") from e
        self.answers[device] = dict(shares)

    def total(self) -> np.ndarray:
        """The sum of the survivors' inputs, mod 2^32."""
        if not self.masked:
            raise RoundFailedError("no device sent a masked input")
        total = self._sum.copy()
        for survivor in sorted(self.masked):
            total -= prg.expand(self._secret(survivor), self.words)
        for dropped in sorted(self.shared - self.masked):
            key = keys.private_key(self._secret(dropped))
            for survivor in sorted(self.graph[dropped] & self.masked):
                seed = keys.agree(key, self.advertised[survivor].mask, keys.MASK, self.context)
                mask = prg.expand(seed, self.words)
                total = total - mask if mask_sign(survivor, dropped) > 0 else total + mask
        return total

    def _secret(self, device: str) -> bytes:
        """A survivor's seed or a dropped device's mask key, from its neighbours' answers."""
        shares = [shamir.Share.from_bytes(a[device]) for a in self.answers.values() if device in a]
        if len(shares) < self.threshold:
            state = "survivor" if device in self.masked else "dropped device"
            raise RoundFailedError(f"{len(shares)} of {device!r}'s neighbours answered for the {state}; "
                              f"its masks need {self.threshold}")  # fmt: skip
        return shamir.combine(shares, self.threshold)

    def _member(self, device: str, stage: Mapping[str, object] | set[str], what: str) -> None:
        if device not in self.graph:
            raise StageError(f"{device!r} is not in this round's cohort")
        if device in stage:
            raise DuplicateMessageError(f"{device!r} already {what}")
