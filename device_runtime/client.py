"""The device side of PROTOCOL.md v1 over HTTP (httpx), with retries and caching."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from fedper.common.errors import FedperError
from fedper.common.protocol import (
    Accepted,
    Challenge,
    ChallengeRequest,
    Enrolled,
    EnrollmentRequest,
    Error,
    ErrorCode,
    Header,
    Route,
    Status,
    Task,
)
from fedper.device_runtime.retry import Backoff, TransientError, with_retries

Attest = Callable[[str], str]  # the server's nonce -> the platform's integrity token that binds it


class RunFinishedError(FedperError):
    """``410 run_finished``: stop."""


class RefusedError(FedperError):
    """A 4xx the device cannot fix by retrying (with the server's code and message)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class NotInCohortError(FedperError):
    """``409 not_in_cohort``: we hold no unexpired slot of the round (ours expired, or we never
    had one). Not a failure: wait ``retry_after`` and ask for a task again."""

    def __init__(self, retry_after: float, message: str):
        super().__init__(message)
        self.retry_after = retry_after


class CorruptDownloadError(FedperError):
    """A download whose bytes do not match the sha256 the manifest or task promised."""


@dataclass(frozen=True)
class NoTask:
    retry_after: float


class ProtocolClient:
    """One device's connection to the server. ``transport`` lets an emulated fleet break requests
    (:class:`~device_runtime.emulation.FlakyTransport`) and tests record or reroute them."""

    def __init__(
        self,
        server: str,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.server = server.rstrip("/")
        self.token = token
        self._http = httpx.Client(base_url=self.server, timeout=120, transport=transport)
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.token:
            headers[Header.AUTHORIZATION] = f"Bearer {self.token}"
        return headers

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def call() -> httpx.Response:
            response = self._http.request(method, path, **kwargs)
            if response.status_code >= 500:
                raise TransientError(f"{response.status_code} from {path}")
            if response.status_code == 409 and self._refused(response).code == ErrorCode.UPLOAD_IN_PROGRESS:
                # Our previous attempt (its connection lost on our side) is still arriving at the
                # server: wait, and send again (then 202 or duplicate_update).
                raise TransientError(f"an earlier upload to {path} is still arriving")
            return response

        return with_retries(call, self._backoff, self._rng, self._sleep)

    @staticmethod
    def _refused(response: httpx.Response) -> RefusedError:
        try:
            error = Error.model_validate_json(response.content)
        except ValidationError:  # not the protocol's error body (a proxy's page, say)
            return RefusedError(response.status_code, "?", response.text[:200])
        return RefusedError(response.status_code, error.code, error.message)

    # --- endpoints ----------------------------------------------------------------------

    def enroll(self, enrollment_key: str, platform: str = "python", attest: Attest | None = None) -> tuple[str, str]:
        """Enroll; ``attest``, for a server that verifies attestation, turns the server's nonce
        into the platform's token binding it: every attempt takes a new nonce."""

        def attempt() -> httpx.Response:
            request = EnrollmentRequest(enrollment_key=enrollment_key, platform=platform)
            if attest is not None:
                asked = ChallengeRequest(enrollment_key=enrollment_key).model_dump()
                r = self._http.post(Route.CHALLENGE, json=asked)
                if r.status_code >= 500:
                    raise TransientError(f"{r.status_code} from {Route.CHALLENGE}")
                if r.status_code != 201:
                    return r
                nonce = Challenge.model_validate_json(r.content).nonce
                request = request.model_copy(update={"attestation": attest(nonce), "nonce": nonce})
            r = self._http.post(Route.DEVICES, json=request.model_dump(exclude_none=True))
            if r.status_code >= 500:
                raise TransientError(f"{r.status_code} from {Route.DEVICES}")
            return r

        r = with_retries(attempt, self._backoff, self._rng, self._sleep)
        if r.status_code == 429:
            raise TransientError("enrollment rate-limited")
        if r.status_code != 201:
            raise self._refused(r)
        enrolled = Enrolled.model_validate_json(r.content)
        self.token = enrolled.token
        return enrolled.device_id, enrolled.token

    def task(self) -> Task | NoTask:
        """The open round's task; this device says it can take part in secure rounds."""
        r = self._request("GET", Route.TASK, headers=self._headers({Header.CAPABILITIES: Header.SECAGG}))
        if r.status_code == 410:
            raise RunFinishedError()
        if r.status_code == 204:
            return NoTask(_retry_after(r))
        if r.status_code != 200:
            raise self._refused(r)
        return Task.model_validate_json(r.content)

    def status(self) -> Status:
        """``GET /v1/status`` (no auth): the run's state and its newest model version."""
        r = self._request("GET", Route.STATUS)
        if r.status_code != 200:
            raise self._refused(r)
        return Status.model_validate_json(r.content)

    def download(self, path: str, etag: str | None = None) -> tuple[bytes | None, str]:
        """(body, etag); body is None when the cached copy (``etag``) is current (304)."""
        headers = self._headers({Header.IF_NONE_MATCH: etag} if etag else None)
        r = self._request("GET", path, headers=headers)
        if r.status_code == 304:
            return None, etag or ""
        if r.status_code != 200:
            raise self._refused(r)
        return r.content, r.headers.get(Header.ETAG, "")

    def download_verified(self, path: str, sha256: str) -> bytes:
        body, _ = self.download(path)
        assert body is not None
        if hashlib.sha256(body).hexdigest() != sha256:
            raise CorruptDownloadError(f"{path}: {len(body)} bytes whose sha256 is not the expected {sha256}")
        return body

    def upload(self, round_number: int, body: bytes) -> int | None:
        """Accepted-so-far count; None when the server already has this device's update.
        Raises :class:`NotInCohortError` when the round's cohort has no slot for this device."""
        r = self._request(
            "POST", Route.UPDATES.format(round_number=round_number), content=body,
            headers=self._headers({Header.CONTENT_TYPE: Header.OCTET_STREAM}),
        )  # fmt: skip
        if r.status_code == 202:
            return Accepted.model_validate_json(r.content).received
        if r.status_code == 410:
            raise RunFinishedError()
        if r.status_code == 408:
            raise TransientError("the upload did not arrive within the server's upload deadline")
        refused = self._refused(r)
        if refused.code == ErrorCode.DUPLICATE_UPDATE:
            return None  # our earlier upload was counted (its 202 was lost): done
        if refused.code == ErrorCode.NOT_IN_COHORT:
            raise NotInCohortError(_retry_after(r), refused.message)
        raise refused

    # --- a secure round's stages (docs/SECAGG.md) ---------------------------------------

    def secagg_send(
        self,
        route: str,
        round_number: int,
        body: bytes,
        json_body: bool = True,
        headers: dict[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """This device's part of a stage; a repeat of what the server already has is done too;
        sent again after ``Retry-After`` while the stage has not begun."""
        media = Header.JSON if json_body else Header.OCTET_STREAM
        while True:
            r = self._request("POST", route.format(round_number=round_number), content=body,
                              headers=self._headers({Header.CONTENT_TYPE: media, **(headers or {})}))  # fmt: skip
            if r.status_code == 202:
                return
            if r.status_code == 410:
                raise RunFinishedError()
            refused = self._refused(r)
            if refused.code == ErrorCode.SECAGG_STAGE_NOT_OPEN:
                sleep(_retry_after(r))
                continue
            if refused.code != ErrorCode.DUPLICATE_UPDATE:
                raise refused
            return

    def secagg_fetch(self, route: str, round_number: int) -> dict[str, Any] | NoTask:
        """What the server relays for a stage, or NoTask (with its Retry-After) until it has it."""
        r = self._request("GET", route.format(round_number=round_number), headers=self._headers())
        if r.status_code == 204:
            return NoTask(_retry_after(r))
        if r.status_code == 410:
            raise RunFinishedError()
        if r.status_code != 200:
            raise self._refused(r)
        body: dict[str, Any] = r.json()
        return body


def _retry_after(response: httpx.Response, default: float = 5.0) -> float:
    """The answer's ``Retry-After`` in seconds (``default`` when absent or not a number)."""
    try:
        return max(0.0, float(response.headers.get(Header.RETRY_AFTER, default)))
    except ValueError:
        return default
