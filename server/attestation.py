"""Device attestation at enrollment (PROTOCOL.md, "POST /v1/devices"): the operator's verifier.

The enrollment key ships inside every copy of the app, so anyone can enroll as many devices
as the rate limits allow. What ties an enrollment to a genuine install on a genuine phone is
the platform's attestation: on Android, a Play Integrity token that the app requests with a
nonce and the server has Google decode (``decodeIntegrityToken``, with the operator's cloud
credentials). The server cannot ship those credentials, so verification is a hook:
``--attestation package.module:function``, a function ``(token, platform, nonce) -> str | None``
that returns why a token is refused, or None to accept it. It must check that the token binds
``nonce``: the server issues each nonce (``POST /v1/devices/challenge``) and takes it once, so a
token cannot enroll twice.

With a verifier configured, the server itself refuses an enrollment without a token or without
a nonce it issued and has not seen used (``403 attestation_failed``): the verifier is not asked.
The verifier runs on its own pool of ``--attestation-workers`` threads, never on the threads that
answer other requests, with at most ``--attestation-queue`` enrollments waiting for one and an
answer due within ``--attestation-timeout`` seconds; past either, ``503 server_busy``. A slow or
hung verification service then costs enrollments, not the rounds.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from queue import PriorityQueue

from anyio import to_thread

from fedper.common.errors import ConfigError
from fedper.server.refusals import AttestationFailedError, RateLimitedError, ServerBusyError
from fedper.server.storage import Database

Verifier = Callable[[str, str | None, str], str | None]  # (token, platform, nonce) -> why refused, or None
NONCE_SECONDS = 300  # how long a challenge's nonce may wait for its enrollment
MAX_NONCES = 100_000  # outstanding nonces kept; the oldest go first
log = logging.getLogger("fedper.server")


def load_verifier(spec: str) -> Verifier | None:
    """The function named ``module:function``, or None for an empty spec. It must take three
    arguments (token, platform, nonce): a verifier of two (token, platform) cannot check the nonce."""
    if not spec:
        return None
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"--attestation must be module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--attestation: cannot import {module_name!r}: {exc}") from exc
    verifier = getattr(module, name, None)
    if not callable(verifier):
        raise ConfigError(f"--attestation: {module_name!r} has no function {name!r}")
    try:
        inspect.signature(verifier).bind("token", "platform", "nonce")
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"--attestation: {spec} must take (token, platform, nonce) and check that the token binds the nonce "
            f"(protocol revision 1.8; docs/SERVER.md): {exc}"
        ) from exc
    found: Verifier = verifier
    return found


class Nonces:
    """Single-use nonces for attestation requests: issued, then taken once within NONCE_SECONDS.
    In memory: after a restart no nonce is valid, and a device asks for another."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._issued: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self) -> str:
        nonce = secrets.token_hex(16)
        with self._lock:
            self._issued[nonce] = self._clock() + NONCE_SECONDS
            while len(self._issued) > MAX_NONCES:
                self._issued.popitem(last=False)
        return nonce

    def take(self, nonce: str) -> bool:
        """Whether ``nonce`` was issued, has not expired and was not taken before (it is now)."""
        with self._lock:
            expires = self._issued.pop(nonce, None)
        return expires is not None and self._clock() < expires


class SharedNonces:
    """:class:`Nonces` in the database, for processes that share it (docs/SCALING.md): a nonce
    one replica issued can be taken at another. Call from a worker thread (it reads and writes)."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self._db, self._clock = db, clock

    def issue(self) -> str:
        nonce = secrets.token_hex(16)
        with self._db.transaction() as tx:
            self._db.nonces.issue(tx, nonce, self._clock() + NONCE_SECONDS)
        return nonce

    def take(self, nonce: str) -> bool:
        with self._db.transaction() as tx:
            return self._db.nonces.take(tx, nonce, self._clock())


@dataclass(order=True)
class _Job:
    """One enrollment's verification, queued: a new address's lane first, then first come."""

    lane: int  # 0: an address with no enrollment in the window (a new phone), 1: the others
    seq: int
    call: Callable[[], str | None] = field(compare=False)
    started: Future[None] = field(compare=False, default_factory=Future)
    done: Future[str | None] = field(compare=False, default_factory=Future)
    address: str = field(compare=False, default="")
    abandoned: bool = field(compare=False, default=False)  # its request gave up: skip it
    released: bool = field(compare=False, default=False)  # its place given back


class AttestationService:
    """The verifier, the nonces it checks tokens against, and the threads it runs on.

    A flood of fake tokens from some addresses must not keep a new phone out: each
    address has at most ``per_address`` verifications waiting or running, and an address that
    has not enrolled in the window (a new phone, ``first``) is served before the others.
    """

    def __init__(self, verifier: Verifier, workers: int, queue: int, timeout: float, retry_after: int,
                 per_address: int = 2, nonces: Nonces | SharedNonces | None = None) -> None:  # fmt: skip
        self.verifier, self.timeout, self.retry_after = verifier, timeout, retry_after
        self.nonces = nonces or Nonces()
        self._capacity, self._per_address = workers + queue, per_address
        self._jobs: PriorityQueue[_Job] = PriorityQueue()
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()  # verifications waiting or running, per address
        self._seq = 0
        self._threads = [threading.Thread(target=self._work, name=f"attestation-{i}", daemon=True)
                         for i in range(workers)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _busy(self, why: str) -> ServerBusyError:
        return ServerBusyError(why, self.retry_after)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job.seq < 0:  # close()
                return
            if job.abandoned or not job.started.set_running_or_notify_cancel():
                continue
            job.started.set_result(None)
            try:
                job.done.set_result(job.call())
            except BaseException as exc:  # the verifier's failure, reported to the request
                job.done.set_exception(exc)

    def _admit(self, address: str, first: bool, call: Callable[[], str | None]) -> _Job:
        with self._lock:
            if self._held[address] >= self._per_address:
                raise RateLimitedError(f"{self._per_address} attestations from this address are being verified; "
                                   "retry when they are done", math.ceil(self.timeout))  # fmt: skip
            if self._held.total() >= self._capacity:
                raise self._busy("the attestation service has as many enrollments waiting as it takes; retry later")
            self._held[address] += 1
            self._seq += 1
            job = _Job(0 if first else 1, self._seq, call, address=address)
        job.done.add_done_callback(lambda _: self._release(job))
        self._jobs.put(job)
        return job

    def _release(self, job: _Job) -> None:
        """Give the job's place back, once: when it is done, or when it was given up unstarted."""
        with self._lock:
            if job.released:
                return
            job.released = True
            self._held[job.address] -= 1
            if self._held[job.address] <= 0:
                del self._held[job.address]

    async def verify(self, token: str | None, platform: str | None, nonce: str | None, address: str = "",
                     first: bool = True) -> None:  # fmt: skip
        """Nothing if the device may enroll; ``403 attestation_failed``, ``429 rate_limited`` or
        ``503 server_busy``. ``address`` is the limits' key of the request's address; ``first``:
        it has not enrolled in the window. Up to ``timeout`` seconds waiting for a thread, then
        up to ``timeout`` seconds for the verifier's answer."""
        if not token:
            raise AttestationFailedError("this server needs an attestation token")
        if nonce is None or not await to_thread.run_sync(self.nonces.take, nonce):
            raise AttestationFailedError("the attestation needs a nonce of this server's (POST /v1/devices/challenge), "
                                         "fresh and not used before")  # fmt: skip
        job = self._admit(address, first, lambda: self.verifier(token, platform, nonce))
        try:
            await asyncio.wait_for(asyncio.wrap_future(job.started), self.timeout)
        except TimeoutError as exc:
            raise self._busy(f"no attestation thread was free within {self.timeout:g} s; retry later") from exc
        finally:
            if not job.started.done() or job.started.cancelled():  # timed out or the request went away
                job.abandoned = True
                job.started.cancel()  # False once a thread has it: then it runs, and its end gives the place back
                if job.started.cancelled():
                    self._release(job)
        try:
            refused = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.done)), self.timeout)
        except TimeoutError as exc:
            log.warning(json.dumps({"event": "attestation_timeout", "seconds": self.timeout}))
            raise self._busy(f"the attestation service did not answer within {self.timeout:g} s; retry later") from exc
        except Exception as exc:  # the verifier's service failed: not the device's fault
            log.warning(json.dumps({"event": "attestation_unavailable", "error": str(exc)[:300]}))
            raise self._busy("the attestation could not be verified now; retry later") from exc
        if refused is not None:
            raise AttestationFailedError(f"attestation refused: {refused}"[:300])

    def close(self) -> None:
        for _ in self._threads:  # a thread inside a hung verifier stays there: they are daemons
            self._jobs.put(_Job(-1, -1, lambda: None))
