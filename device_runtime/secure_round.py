"""A device's part in a secure round (PROTOCOL.md, "Secure aggregation"; docs/SECAGG.md): its
keys and shares before it trains, its masked update after, and its answer to the unmasking. The
update never leaves the device in the clear."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from fedper.common.dp.clipping import clip_delta
from fedper.common.errors import FedperError
from fedper.common.protocol import (
    Header,
    OctetsError,
    Route,
    SecAggKeys,
    SecAggNeighbours,
    SecAggSealed,
    SecAggTask,
    SecAggUnmaskAnswer,
    SecAggUnmaskRequest,
    octets,
    octets_text,
)
from fedper.common.secagg.device_session import Advertisement, DeviceSession, RequestRefusedError
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.keys import ChannelError
from fedper.common.secagg.shamir import ShamirError
from fedper.device_runtime.client import NoTask, ProtocolClient


class SecureRoundRefusedError(FedperError):
    """This device's part in a secure round ends (not its run): the session refused a request
    (too few neighbours, a malicious list) or a relayed message did not open or parse."""


_REFUSALS = (RequestRefusedError, ChannelError, ShamirError, ValidationError, OctetsError)


@contextlib.contextmanager
def _refusing() -> Iterator[None]:
    try:
        yield
    except _REFUSALS as e:
        raise SecureRoundRefusedError(str(e)) from e


class SecureRound:
    """One device in one secure round, over its protocol client."""

    def __init__(
        self,
        client: ProtocolClient,
        device_id: str,
        round_number: int,
        task: SecAggTask,
        sleep: Callable[[float], None] = time.sleep,
        max_wait: float = 5.0,
    ) -> None:
        self.client, self.round, self.task = client, round_number, task
        self.session = DeviceSession(device_id, task.session.encode())
        self._sleep, self._max_wait = sleep, max_wait

    def _wait_for(self, route: str) -> dict[str, Any]:
        """Ask until the server has what it relays for this stage (each 204 waits its Retry-After)."""
        while True:
            answer = self.client.secagg_fetch(route, self.round)
            if not isinstance(answer, NoTask):
                return answer
            self._sleep(min(answer.retry_after, self._max_wait))

    def _send(self, route: str, body: bytes, json_body: bool = True, headers: dict[str, str] | None = None) -> None:
        self.client.secagg_send(route, self.round, body, json_body, headers, self._sleep)

    def share(self) -> None:
        """Advertise the keys, seal the shares for the neighbours, keep theirs."""
        with _refusing():
            self._share()

    def _share(self) -> None:
        own = self.session.advertise()
        keys = SecAggKeys(channel_key=octets_text(own.channel), mask_key=octets_text(own.mask))
        self._send(Route.SECAGG_KEYS, keys.model_dump_json().encode())
        relayed = SecAggNeighbours.model_validate(self._wait_for(Route.SECAGG_KEYS))
        if relayed.threshold != self.task.threshold or len(relayed.neighbours) > self.task.neighbours:
            raise RequestRefusedError(
                f"the server relayed {len(relayed.neighbours)} neighbours at threshold {relayed.threshold}; the task "
                f"said at most {self.task.neighbours} at {self.task.threshold}"
            )
        neighbours = {
            d: Advertisement(octets(k.channel_key), octets(k.mask_key)) for d, k in relayed.neighbours.items()
        }
        sealed = self.session.share_keys(neighbours, relayed.threshold)
        self._send(Route.SECAGG_SHARES, SecAggSealed(shares={d: octets_text(c) for d, c in sealed.items()})
                   .model_dump_json().encode())  # fmt: skip
        received = SecAggSealed.model_validate(self._wait_for(Route.SECAGG_SHARES))
        self.session.receive_shares({d: octets(c) for d, c in received.shares.items()})

    def delta(
        self, trained: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], names: Sequence[str]
    ) -> tuple[np.ndarray, bool]:
        """The base delta (float64, the manifest's base order), clipped to the task's norm as
        PROTOCOL.md's clipping defines it (what the words encode), and whether it was within
        the norm before clipping (under DP, the flag word adaptive clipping counts)."""
        clipped = clip_delta(trained, received, names, self.task.clip_norm)
        delta = np.concatenate([clipped.tensors[n].astype(np.float64).ravel()
                                - np.asarray(received[n], np.float64).ravel() for n in names])  # fmt: skip
        return delta, clipped.unclipped

    def words(self, delta: np.ndarray, unclipped: bool, num_samples: int, dp: bool) -> np.ndarray:
        """The words to mask: under DP, equal weights and the unclipped bit as a flag."""
        fixed = FixedPoint(self.task.clip_norm, self.task.cohort, self.task.weight_cap, 1 if dp else 0)
        return fixed.encode(delta, num_samples, (int(unclipped),) if dp else ())

    def send_masked(self, words: np.ndarray) -> None:
        masked = self.session.masked_input(words)
        unopened = {Header.SECAGG_UNOPENED: ",".join(self.session.unopened)} if self.session.unopened else {}
        self._send(Route.SECAGG_MASKED, masked.astype("<u4").tobytes(), json_body=False, headers=unopened)

    def unmask(self) -> None:
        """Answer the server's one unmasking request (the session refuses a malicious one)."""
        with _refusing():
            self._unmask()

    def _unmask(self) -> None:
        request = SecAggUnmaskRequest.model_validate(self._wait_for(Route.SECAGG_UNMASK))
        answer = self.session.unmask(request.dropped, request.survivors)
        self._send(Route.SECAGG_UNMASK, SecAggUnmaskAnswer(shares={d: octets_text(v) for d, v in answer.items()})
                   .model_dump_json().encode())  # fmt: skip
