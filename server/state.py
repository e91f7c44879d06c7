"""Everything a request handler needs, built once at start-up."""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedper.common.errors import FedperError
from fedper.common.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest
from fedper.server.attestation import AttestationService, SharedNonces, load_verifier
from fedper.server.clock import SteadyClock
from fedper.server.config import ServerConfig
from fedper.server.credentials import Secrets, load_or_create, write_region_tokens
from fedper.server.dashboard_data import EndedRows
from fedper.server.disk_room import DiskRoom, round_reserve
from fedper.server.enrollment import Enrollment
from fedper.server.log_tail import LogTail
from fedper.server.metrics_registry import MetricsRegistry
from fedper.server.rate_limit import Limiter, RateLimiter, SharedRateLimiter
from fedper.server.root_link import RootLink
from fedper.server.rounds import Clock, RoundManager
from fedper.server.run_history import RunHistory
from fedper.server.storage import Database, StorageError
from fedper.server.tasks import Tasks
from fedper.server.upload_places import UploadPlaces
from fedper.server.uploads import Uploads

log = logging.getLogger("fedper.server")


@dataclass
class ServerState:
    config: ServerConfig
    manifest: Manifest
    manifest_sha256: str
    secrets: Secrets
    db: Database
    rounds: RoundManager
    auth_failures: Limiter  # wrong bearer tokens per address
    metrics: MetricsRegistry
    places: UploadPlaces  # for upload bodies in flight
    uploads: Uploads
    enrollment: Enrollment
    tasks: Tasks
    history: RunHistory
    log_tail: LogTail
    ended_rows: EndedRows
    attestation: AttestationService | None = None
    region_tokens: dict[str, int] = field(default_factory=dict)  # at a root: region by token hash

    def artifact_path(self, name: str) -> Path | None:
        """Only files the manifest names (and the manifest itself); never a path."""
        allowed = set(self.manifest.artifacts.values()) | {MANIFEST_FILE}
        if name not in allowed:
            return None
        return self.config.artifacts / name


MIN_ADMIN_TOKEN_LENGTH = 32
UNLIMITED = 2**62


class StartupError(FedperError, RuntimeError):
    """The server cannot start on this data directory / export."""


def _open_database(path: Path, config: ServerConfig, disk: DiskRoom) -> Database:
    """The database, or, when SQLite's file cannot be opened for writing on a disk without room,
    the same database read-only (the server starts draining, PROTOCOL.md, "Errors")."""
    if config.database:
        try:
            return Database(config.database, config.db_busy_timeout)
        except StorageError as exc:
            raise StartupError(f"cannot open the database {_without_password(config.database)}: {exc}") from exc
    try:
        return Database(path, config.db_busy_timeout)
    except StorageError as exc:
        short = disk.shortage()
        if short is None or not path.exists():
            raise StartupError(f"cannot open {path}: {exc}") from exc
        log.error(json.dumps({"event": "database_read_only", "reason": short, "error": str(exc)}))
        try:
            return Database(path, config.db_busy_timeout, read_only=True)
        except StorageError as again:
            raise StartupError(f"cannot open {path} even read-only ({again}); {short}") from again


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def open_state(config: ServerConfig, clock: Clock | None = None, free: Callable[[], int] | None = None) -> ServerState:
    """Everything the handlers need; ``clock`` and ``free`` (free bytes of the data directory's
    disk) are injected by tests."""
    from fedper.common.manifest import sha256_file

    verifier = load_verifier(config.attestation)
    try:
        manifest = read_manifest(config.artifacts)
    except ManifestError as exc:
        raise StartupError(f"cannot serve {config.artifacts}: {exc}") from exc
    manifest_sha = sha256_file(config.artifacts / MANIFEST_FILE)
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    initial_base = config.artifacts / manifest.artifacts["initial_base"]
    reserve = round_reserve(config.slots, initial_base.stat().st_size, config.min_free_mib)
    disk = DiskRoom(data_dir, reserve, free)
    db = _open_database(data_dir / "state.db", config, disk)
    known = db.get_meta("manifest_sha256")
    if known is None and db.read_only:
        db.close()
        raise StartupError(f"{data_dir} is a new data directory on a disk too full to write: {disk.shortage()}")
    if known is None:
        with db.transaction() as tx:
            db.set_meta(tx, "manifest_sha256", manifest_sha)
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
    root = None
    if config.root:
        try:
            root = RootLink.from_token_file(config.root, config.region, Path(config.region_token_file))
        except FedperError as exc:
            db.close()
            raise StartupError(str(exc)) from exc
    rounds = RoundManager(config, manifest, db, data_dir, clock or SteadyClock(), disk, root)
    rounds.start(initial_base)
    v0 = rounds.version_file(0)
    assert v0 is not None
    limit = config.max_upload_bytes or 4 * v0[0].stat().st_size
    metrics = MetricsRegistry()
    places = UploadPlaces(config.max_inflight_uploads, config.busy_upload_rate, config.upload_rate_grace,
                          config.retry_after)  # fmt: skip
    attestation = None
    if verifier is not None:
        attestation = AttestationService(verifier, config.attestation_workers, config.attestation_queue,
                                         config.attestation_timeout, config.retry_after,
                                         config.attestation_per_address,
                                         SharedNonces(db) if db.shared else None)  # fmt: skip
    total = config.enroll_total_per_minute

    def limiter(name: str, limit: int) -> Limiter:
        """In this process's memory, or, when other processes share the database, in it."""
        return SharedRateLimiter(db, name, limit) if db.shared and limit < UNLIMITED else RateLimiter(limit)

    enrollment = Enrollment(
        secrets, db, rounds,
        per_address=limiter("enrollments", config.enroll_per_minute),
        everyone=limiter("all_enrollments", total or UNLIMITED),
        first_of_address=limiter("first_enrollments", max(1, total // 4) if total else UNLIMITED),
        challenges=limiter("challenges", config.enroll_per_minute),
        key_failures=limiter("enrollment_key_failures", config.auth_failures_per_minute),
        attestation=attestation,
    )  # fmt: skip
    history = RunHistory(db)
    history.ended()  # a long run's stored reports are read now, not by the first scrape
    return ServerState(
        config=config,
        manifest=manifest,
        manifest_sha256=manifest_sha,
        secrets=secrets,
        db=db,
        rounds=rounds,
        auth_failures=limiter("auth_failures", config.auth_failures_per_minute),
        metrics=metrics,
        places=places,
        uploads=Uploads(config, manifest, rounds, places, metrics, limit),
        enrollment=enrollment,
        tasks=Tasks(config, db, rounds, manifest_sha),
        history=history,
        ended_rows=EndedRows(),
        log_tail=LogTail(),
        attestation=attestation,
        region_tokens=write_region_tokens(data_dir, secrets.admin_token, config.regions) if config.regions else {},
    )
