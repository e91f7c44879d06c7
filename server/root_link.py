"""A regional server's client of its root (PROTOCOL.md, "Regional aggregation"): where the root
stands, forwarding a round's sum, how the root ended a round, and a published version's bytes
(checked against the sha256 the root names in its ETag)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
from pydantic import ValidationError

from fedper.common.errors import FedperError
from fedper.common.protocol import Header, RegionView, RoundInfo, Route


class RootUnreachableError(FedperError, RuntimeError):
    """The root did not answer, or answered 5xx or 429: ask again on a later tick."""


class RootRefusedError(FedperError, RuntimeError):
    """The root answered 4xx: ``code`` is the protocol's error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"the root refused ({status} {code}): {message}")
        self.status, self.code = status, code


class RootLink:
    """``client``: for tests, another way to reach the root than a socket of its own."""

    def __init__(
        self, url: str, region: int, token: str, timeout: float = 30.0, client: httpx.Client | None = None
    ) -> None:
        self.region = region
        self._http = client or httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self._auth = {Header.AUTHORIZATION: f"Bearer {token}"}

    @classmethod
    def from_token_file(cls, url: str, region: int, token_file: Path) -> RootLink:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise FedperError(f"cannot read the region token {token_file}: {exc}") from exc
        if not token:
            raise FedperError(f"{token_file} is empty: it should hold the root's region_tokens/region-{region}")
        return cls(url, region, token)

    def close(self) -> None:
        self._http.close()

    def view(self) -> RegionView:
        path = Route.REGION.format(region=self.region)
        try:
            return RegionView.model_validate(self._json("GET", path))
        except ValidationError as exc:
            raise RootUnreachableError(f"GET {path}: not a RegionView ({exc.errors()[:1]})") from exc

    def forward(self, number: int, body: bytes) -> None:
        """Round ``number``'s sum (the same bytes may be sent again: the root answers the same)."""
        path = Route.REGION_SUM.format(round_number=number, region=self.region)
        self._json("POST", path, content=body, headers={Header.CONTENT_TYPE: Header.OCTET_STREAM})

    def round(self, number: int) -> RoundInfo | None:
        """How the root's round ``number`` stands (None: the root has no such round)."""
        path = Route.ROUND.format(round_number=number)
        try:
            return RoundInfo.model_validate(self._json("GET", path))
        except RootRefusedError as exc:
            if exc.status == 404:
                return None
            raise
        except ValidationError as exc:
            raise RootUnreachableError(f"GET {path}: not a RoundInfo ({exc.errors()[:1]})") from exc

    def version(self, version: int) -> tuple[bytes, str]:
        """Version ``version``'s base as the root publishes it, and its sha256."""
        answer = self._send("GET", Route.MODEL_BASE.format(version=version))
        named = answer.headers.get(Header.ETAG, "").strip('"')
        digest = hashlib.sha256(answer.content).hexdigest()
        if named != digest:
            raise RootUnreachableError(f"version {version} arrived with sha256 {digest[:12]}..., the root named "
                                       f"{named[:12] or 'none'}: a transfer broken on the way")  # fmt: skip
        return answer.content, digest

    def _json(self, method: str, path: str, **kwargs: object) -> object:
        answer = self._send(method, path, **kwargs)
        try:
            return answer.json()
        except ValueError as exc:
            raise RootUnreachableError(f"{method} {path}: the root's answer is not JSON") from exc

    def _send(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        headers = {**self._auth, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        try:
            answer = self._http.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise RootUnreachableError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if answer.status_code >= 500 or answer.status_code == 429:
            raise RootUnreachableError(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
        if answer.status_code >= 400:
            try:
                body = answer.json()
                code, message = str(body.get("code", "")), str(body.get("message", ""))
            except (ValueError, AttributeError):
                code, message = "", answer.text[:200]
            raise RootRefusedError(answer.status_code, code, message)
        return answer
