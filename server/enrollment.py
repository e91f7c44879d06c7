"""Enrollment: an attestation nonce, and a new device's id and token.

The enrollment key ships inside apps (not a secret), so every enrollment counts against its
address's minute and against all addresses' minute together; an address's first enrollment of
the minute may take a quarter more of the latter, so that a flood from some addresses cannot
lock a new phone out. A wrong key counts as a failed authentication of its address.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass

from anyio import to_thread

from fedper.common.protocol import Challenge, ChallengeRequest, Enrolled, EnrollmentRequest
from fedper.server.attestation import NONCE_SECONDS, AttestationService
from fedper.server.credentials import Secrets, new_token, same_secret, token_hash
from fedper.server.rate_limit import Limiter, failed_attempt
from fedper.server.refusals import NotFoundError, RateLimitedError
from fedper.server.rounds import RoundManager
from fedper.server.storage import Database

log = logging.getLogger("fedper.server")
ENROLLMENT_KEY = "enrollment key"  # the one key all enrollments count under


@dataclass
class Enrollment:
    secrets: Secrets
    db: Database
    rounds: RoundManager
    per_address: Limiter  # enrollments per address
    everyone: Limiter  # enrollments from all addresses together
    first_of_address: Limiter  # an address's first enrollment of the minute, once `everyone` is spent
    challenges: Limiter  # attestation nonces per address
    key_failures: Limiter  # wrong enrollment keys per address
    attestation: AttestationService | None

    def _check_key(self, key: str | None, address: str) -> None:
        if key is None or not same_secret(key, self.secrets.enrollment_key):
            raise failed_attempt(self.key_failures, address, "wrong enrollment key")

    def challenge(self, asked: ChallengeRequest | None, address: str) -> Challenge:
        """A single-use nonce for the platform's attestation request (docs/SERVER.md)."""
        self._check_key(asked.enrollment_key if asked is not None else None, address)
        if self.attestation is None:
            raise NotFoundError("attestation on this server (it enrolls without a token)")
        allowed, wait = self.challenges.allow(address)
        if not allowed:
            raise RateLimitedError("too many challenges from this address", wait)
        return Challenge(nonce=self.attestation.nonces.issue(), expires_in=NONCE_SECONDS)

    def _limits(self, address: str) -> bool:
        """Count the enrollment against its limits (429 when one is spent); whether it is the
        address's first in the window. The limits may live in the database: run in a thread."""
        first = not self.per_address.count(address)  # the address's first enrollment in the window
        allowed, wait = self.per_address.allow(address)
        if not allowed:
            raise RateLimitedError("too many enrollments from this address", wait)
        allowed, wait = self.everyone.allow(ENROLLMENT_KEY)
        if not allowed and first:  # a flood from some addresses must not lock out a new one
            allowed, wait = self.first_of_address.allow(ENROLLMENT_KEY)
        if not allowed:
            raise RateLimitedError("too many enrollments from all addresses together; try again later", wait)
        return first

    async def enroll(self, enrolling: EnrollmentRequest | None, address: str) -> Enrolled:
        """A new device, once its key, the limits and (if configured) its attestation pass (the
        route refuses it while the server drains, before its body is read)."""
        await to_thread.run_sync(self._check_key, enrolling.enrollment_key if enrolling is not None else None, address)
        assert enrolling is not None
        first = await to_thread.run_sync(self._limits, address)
        if self.attestation is not None:
            await self.attestation.verify(enrolling.attestation, enrolling.platform, enrolling.nonce, address, first)
        device_id, token = f"d-{secrets.token_hex(8)}", new_token()
        await to_thread.run_sync(self.db.devices.add, device_id, token_hash(token), enrolling.platform)
        log.info(json.dumps({"event": "device_enrolled", "device": device_id, "platform": enrolling.platform}))
        await to_thread.run_sync(self.rounds.enrolled)
        return Enrolled(device_id=device_id, token=token)
