"""Everything a request handler needs, built once at start-up."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from fedper.errors import FedperError
from fedper.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest
from server.config import ServerConfig
from server.credentials import Secrets, load_or_create
from server.metrics_registry import MetricsRegistry
from server.rate_limit import RateLimiter
from server.rounds import Clock, RoundManager
from server.storage import Database

log = logging.getLogger("fedper.server")


@dataclass
class ServerState:
    config: ServerConfig
    manifest: Manifest
    manifest_sha256: str
    secrets: Secrets
    db: Database
    rounds: RoundManager
    limiter: RateLimiter  # enrollments per address
    auth_failures: RateLimiter  # failed authentications per address
    metrics: MetricsRegistry
    max_upload_bytes: int
    uploads_in_flight: int = 0

    def artifact_path(self, name: str) -> Path | None:
        """Only files the manifest names (and the manifest itself); never a path."""
        allowed = set(self.manifest.artifacts.values()) | {MANIFEST_FILE}
        if name not in allowed:
            return None
        return self.config.artifacts / name


MIN_ADMIN_TOKEN_LENGTH = 32


class StartupError(FedperError, RuntimeError):
    """The server cannot start on this data directory / export."""


def open_state(config: ServerConfig, clock: Clock = time.time) -> ServerState:
    from fedper.manifest import sha256_file

    try:
        manifest = read_manifest(config.artifacts)
    except ManifestError as exc:
        raise StartupError(f"cannot serve {config.artifacts}: {exc}") from exc
    manifest_sha = sha256_file(config.artifacts / MANIFEST_FILE)
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(data_dir / "state.db")
    known = db.get_meta("manifest_sha256")
    if known is None:
        with db.transaction() as conn:
            db.set_meta(conn, "manifest_sha256", manifest_sha)
    elif known != manifest_sha:
        db.close()
        raise StartupError(
            f"{data_dir} was made for another export (manifest sha256 {known[:12]}..., this one is "
            f"{manifest_sha[:12]}...): use a new --data-dir or the original --artifacts"
        )
    secrets = load_or_create(data_dir)
    if len(secrets.admin_token) < MIN_ADMIN_TOKEN_LENGTH:
        db.close()
        raise StartupError(
            f"the admin token is {len(secrets.admin_token)} characters long; use at least "
            f"{MIN_ADMIN_TOKEN_LENGTH} random ones (python -c 'import secrets; print(secrets.token_urlsafe(32))'), "
            "or unset FEDPER_ADMIN_TOKEN and delete the data directory's admin_token to have one generated"
        )
    rounds = RoundManager(config, manifest, db, data_dir, clock)
    initial_base = config.artifacts / manifest.artifacts["initial_base"]
    rounds.start(initial_base)
    v0 = rounds.version_file(0)
    assert v0 is not None
    limit = config.max_upload_bytes or 4 * v0[0].stat().st_size
    return ServerState(
        config=config,
        manifest=manifest,
        manifest_sha256=manifest_sha,
        secrets=secrets,
        db=db,
        rounds=rounds,
        limiter=RateLimiter(config.enroll_per_minute),
        auth_failures=RateLimiter(config.auth_failures_per_minute),
        metrics=MetricsRegistry(),
        max_upload_bytes=limit,
    )
