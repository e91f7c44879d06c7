"""The device side of PROTOCOL.md v1 over HTTP (httpx), with retries and caching."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from device_runtime.retry import Backoff, TransientError, with_retries


class RunFinishedError(Exception):
    """``410 run_finished``: stop."""


class RefusedError(Exception):
    """A 4xx the device cannot fix by retrying (with the server's code and message)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Task:
    round: int
    model_version: int
    deadline: str | None
    base_url: str
    manifest_url: str
    manifest_sha256: str
    config: dict[str, Any]


@dataclass(frozen=True)
class NoTask:
    retry_after: float


class ProtocolClient:
    """One device's connection to the server. ``transport`` lets tests record or break requests."""

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
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def call() -> httpx.Response:
            response = self._http.request(method, path, **kwargs)
            if response.status_code >= 500:
                raise TransientError(f"{response.status_code} from {path}")
            return response

        return with_retries(call, self._backoff, self._rng, self._sleep)

    @staticmethod
    def _refused(response: httpx.Response) -> RefusedError:
        try:
            body = response.json()
            return RefusedError(response.status_code, body.get("code", "?"), body.get("message", ""))
        except ValueError:
            return RefusedError(response.status_code, "?", response.text[:200])

    # --- endpoints ----------------------------------------------------------------------

    def enroll(self, enrollment_key: str, platform: str = "python") -> tuple[str, str]:
        r = self._request("POST", "/v1/devices", json={"enrollment_key": enrollment_key, "platform": platform})
        if r.status_code == 429:
            raise TransientError("enrollment rate-limited")
        if r.status_code != 201:
            raise self._refused(r)
        body = r.json()
        self.token = body["token"]
        return str(body["device_id"]), str(body["token"])

    def task(self) -> Task | NoTask:
        r = self._request("GET", "/v1/task", headers=self._headers())
        if r.status_code == 410:
            raise RunFinishedError()
        if r.status_code == 204:
            return NoTask(float(r.headers.get("retry-after", "5")))
        if r.status_code != 200:
            raise self._refused(r)
        b = r.json()
        return Task(b["round"], b["model_version"], b.get("deadline"), b["base_url"],
                    b["manifest_url"], b["manifest_sha256"], b.get("config", {}))  # fmt: skip

    def download(self, path: str, etag: str | None = None) -> tuple[bytes | None, str]:
        """(body, etag); body is None when the cached copy (``etag``) is current (304)."""
        headers = self._headers({"If-None-Match": etag} if etag else None)
        r = self._request("GET", path, headers=headers)
        if r.status_code == 304:
            return None, etag or ""
        if r.status_code != 200:
            raise self._refused(r)
        return r.content, r.headers.get("etag", "")

    def download_verified(self, path: str, sha256: str) -> bytes:
        body, _ = self.download(path)
        assert body is not None
        if hashlib.sha256(body).hexdigest() != sha256:
            raise RefusedError(200, "sha256_mismatch", f"{path} does not match its sha256")
        return body

    def upload(self, round_number: int, body: bytes) -> int | None:
        """Accepted-so-far count; None when the server already has this device's update."""
        r = self._request(
            "POST", f"/v1/rounds/{round_number}/updates", content=body,
            headers=self._headers({"Content-Type": "application/octet-stream"}),
        )  # fmt: skip
        if r.status_code == 202:
            return int(r.json()["received"])
        if r.status_code == 410:
            raise RunFinishedError()
        if r.status_code == 408:
            raise TransientError("the upload did not arrive within the server's upload deadline")
        refused = self._refused(r)
        if refused.code == "duplicate_update":
            return None  # our earlier upload was counted (its 202 was lost): done
        raise refused
