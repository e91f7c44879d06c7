"""Every setting of ``fedper serve``, in one typed place (also the command's options)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fedper.common.config_cli import nested, option
from fedper.common.dp.config import DPConfig
from fedper.common.errors import ConfigError
from fedper.common.robust_aggregate import AggregationConfig
from fedper.common.secagg.config import SecAggConfig
from fedper.common.train_config import TrainConfig
from fedper.server.publish_check import PublishConfig


@dataclass(frozen=True)
class ServerConfig:
    artifacts: Path = option(Path("artifacts"), "export directory (from fedper export)", metavar="DIR")
    data_dir: Path = option(Path("server-data"), "where the server keeps its state", metavar="DIR")
    database: str = option(
        "", "where the server keeps its records: empty for SQLite's file DIR/state.db, or a PostgreSQL URL "
        "postgresql://USER@HOST:PORT/DB (give its password in PGPASSWORD or ~/.pgpass, not here: a command "
        "line is visible to every user of the machine)", metavar="URL",
    )  # fmt: skip
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "port to listen on")
    rounds: int = option(50, "closed rounds after which the run is finished")
    target_clients: int = option(10, "a round closes as soon as this many updates are accepted")
    min_clients: int = option(2, "at the deadline, a round closes if it has at least this many")
    round_timeout: float = option(600.0, "seconds a round stays open (0: no deadline)")
    start_devices: int = option(
        0, "round 1's clock (its check-in window and deadline) starts once this many devices have enrolled "
        "(0: at the first start); until then devices only check in",
    )  # fmt: skip
    cohort_size: int = option(0, "devices a round wants reports from, before over-selection (0: --target-clients)")
    over_selection: float = option(
        1.3, "a round assigns ceil(cohort size x this) slots, so that dropouts do not stall it (>= 1)"
    )
    report_timeout: float = option(
        0.0, "seconds an assigned device has to upload before its slot is given to another (0: the round's deadline)"
    )
    checkin_window: float = option(
        0.0, "seconds at the start of a round in which asking devices check in; then the slots are drawn "
        "at random among them (0: first come, first served)",
    )  # fmt: skip
    max_participation: int = option(
        0, "accepted updates a device may have in the last --participation-rounds rounds and still get a slot "
        "(0: no limit)",
    )  # fmt: skip
    participation_rounds: int = option(10, "the rounds --max-participation counts over")
    training: TrainConfig = nested(TrainConfig, "as the task asks devices")
    max_upload_bytes: int = option(0, "largest upload accepted (0: 4x the F32 base)")
    max_num_samples: int = option(100_000, "largest num_samples an update may claim")
    retry_after: int = option(5, "seconds idle devices are told to wait (Retry-After)")
    enroll_per_minute: int = option(30, "enrollments allowed per client address (IPv6: per /64) per minute")
    enroll_total_per_minute: int = option(
        600, "enrollments allowed per minute from all addresses together, with the enrollment key (0: no limit)"
    )
    auth_failures_per_minute: int = option(
        20, "failed authentications (wrong token or enrollment key) per client address per minute before 429"
    )
    attestation: str = option(
        "", "module:function(token, platform, nonce) verifying a device's attestation token at enrollment "
        "(docs/SERVER.md; empty: none)",
        metavar="MODULE:FUNCTION",
    )  # fmt: skip
    attestation_workers: int = option(8, "threads the attestation verifier runs on, apart from the requests'")
    attestation_queue: int = option(64, "enrollments that may wait for an attestation thread; more get 503")
    attestation_timeout: float = option(
        10.0, "seconds an enrollment may wait for an attestation thread, then seconds the verifier may take, before 503"
    )
    attestation_per_address: int = option(
        2, "attestations one client address (IPv6: /64) may have waiting or being verified at once; more get 429"
    )
    request_body_timeout: float = option(
        10.0, "seconds a JSON request body (enrollment, secure-round messages) may take to arrive before 408"
    )
    max_requests_per_address: int = option(
        64, "requests one client address (IPv6: per /64) may have in progress at once; more get 429 (0: no limit)"
    )
    aggregation_memory: int = option(
        4096, "MB closing a round may hold: the median, trimmed mean and centered clip hold every update of the "
        "round in float64 (the mean folds one at a time); the server refuses to start if --cohort-size x "
        "--over-selection updates of this base would not fit",
    )  # fmt: skip
    forwarded_allow_ips: str = option(
        "", "comma-separated proxy addresses whose X-Forwarded-For is trusted (default: none; '*': any)"
    )
    upload_timeout: float = option(120.0, "seconds a request body may take to arrive before 408")
    min_upload_rate: float = option(
        1024.0, "bytes per second an upload body must average once --upload-rate-grace is over, or 408 (0: no minimum)"
    )
    upload_rate_grace: float = option(10.0, "seconds an upload body may take before --min-upload-rate applies")
    header_timeout: float = option(10.0, "seconds a client may take to send a request's headers")
    keep_alive_timeout: int = option(5, "seconds an idle keep-alive connection stays open")
    max_inflight_uploads: int = option(32, "uploads received at once; more get 503 server_busy")
    busy_upload_rate: float = option(
        16384.0, "bytes per second an upload must average after --upload-rate-grace while every place is taken "
        "and another device waits: a slower one is cut (408) and its device waits for the next round (0: never)",
    )  # fmt: skip
    db_busy_timeout: float = option(
        5.0, "seconds a request waits for the database's write lock (held by another process) before 503 server_busy"
    )
    close_lease: float = option(
        30.0, "seconds a process closing a round holds it without renewing: a closer that dies or stalls longer "
        "is replaced by another process sharing the database (docs/SCALING.md)",
    )  # fmt: skip
    regions: int = option(
        0, "serve as the root of a tree of this many regional servers (docs/SCALING.md): take each one's sum of "
        "its devices' updates (POST /v1/rounds/{r}/regions/{k}), no devices; a round closes once every region's "
        "sum is in, or at its deadline with --min-clients of them (0: not a root)",
    )  # fmt: skip
    root: str = option(
        "", "serve as a regional server of the root at this URL (http://HOST:PORT): forward each round's sum there "
        "instead of publishing, and train the versions the root publishes (empty: not a region)", metavar="URL",
    )  # fmt: skip
    region: int = option(0, "this regional server's number among the root's --regions (0-based)")
    region_token_file: str = option(
        "", "file holding this region's token, which the root writes to its data directory "
        "(region_tokens/region-K)", metavar="FILE",
    )  # fmt: skip
    max_update_norm: float = option(
        0.0, "largest L2 distance of an update from the round's base, over all base tensors (0: no bound)"
    )
    aggregation: AggregationConfig = nested(AggregationConfig, "when a round closes (without --dp)")
    privacy: DPConfig = nested(DPConfig)
    secure: SecAggConfig = nested(SecAggConfig)
    publish: PublishConfig = nested(PublishConfig, "before a round's aggregate is published")
    min_free_mib: float = option(
        0.0, "free disk space (MiB) below which the server drains: downloads only, no uploads or closes "
        "(0: room for every slot's update, two versions and 64 MiB)",
    )  # fmt: skip
    keep_versions: int = option(
        0, "model versions kept on disk, newest first, besides version 0 and the open round's (0: all)"
    )

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError("--rounds must be at least 1")
        if not 1 <= self.min_clients <= self.target_clients:
            raise ConfigError("need 1 <= --min-clients <= --target-clients")
        if self.round_timeout < 0:
            raise ConfigError("--round-timeout must be >= 0")
        if self.database and not self.database.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"--database must be empty (SQLite) or a postgresql:// URL, got {self.database[:40]!r}")
        if self.start_devices < 0:
            raise ConfigError(f"--start-devices must be >= 0, got {self.start_devices}")
        if self.max_num_samples < 1:
            raise ConfigError("--max-num-samples must be >= 1")
        positive = {
            "--upload-timeout": self.upload_timeout, "--header-timeout": self.header_timeout,
            "--keep-alive-timeout": self.keep_alive_timeout, "--max-inflight-uploads": self.max_inflight_uploads,
            "--busy-upload-rate": self.busy_upload_rate,
            "--db-busy-timeout": self.db_busy_timeout, "--enroll-per-minute": self.enroll_per_minute,
            "--close-lease": self.close_lease,
            "--auth-failures-per-minute": self.auth_failures_per_minute,
        }  # fmt: skip
        for flag, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{flag} must be > 0, got {value}")
        if not self.min_free_mib >= 0:
            raise ConfigError("--min-free-mib must be >= 0 (0: computed from the round's needs)")
        if not self.checkin_window >= 0 or (self.round_timeout and self.checkin_window >= self.round_timeout):
            raise ConfigError("--checkin-window must be >= 0 and shorter than --round-timeout")
        if self.max_participation < 0 or self.participation_rounds < 1:
            raise ConfigError("--max-participation must be >= 0 (0: no limit) and --participation-rounds >= 1")
        if self.keep_versions < 0:
            raise ConfigError("--keep-versions must be >= 0 (0: keep all)")
        if (self.attestation_workers < 1 or self.attestation_queue < 0 or not self.attestation_timeout > 0
                or self.attestation_per_address < 1):  # fmt: skip
            raise ConfigError("--attestation-workers and --attestation-per-address must be >= 1, "
                              "--attestation-queue >= 0, --attestation-timeout > 0")  # fmt: skip
        if self.aggregation_memory < 1:
            raise ConfigError(f"--aggregation-memory must be at least 1 (MB), got {self.aggregation_memory}")
        if not self.request_body_timeout > 0 or self.max_requests_per_address < 0:
            raise ConfigError("--request-body-timeout must be > 0 and --max-requests-per-address >= 0")
        if self.enroll_total_per_minute < 0:
            raise ConfigError("--enroll-total-per-minute must be >= 0 (0: no limit)")
        if not self.min_upload_rate >= 0 or not self.upload_rate_grace >= 0 or not self.busy_upload_rate >= 0:
            raise ConfigError("--min-upload-rate, --busy-upload-rate and --upload-rate-grace must be >= 0")
        if not self.max_update_norm >= 0:
            raise ConfigError("--max-update-norm must be >= 0 (0: no bound)")
        if self.cohort_size < 0 or not self.report_timeout >= 0:
            raise ConfigError("--cohort-size and --report-timeout must be >= 0 (0: their defaults)")
        if not 1 <= self.over_selection <= 100:
            raise ConfigError(f"--over-selection must be in 1..100, got {self.over_selection}")
        if self.regions or self.root:
            self._check_tree()
        if self.privacy.dp:
            self._check_privacy()
        if self.secure.secagg:
            self._check_secure()
        if self.slots < self.target_clients and not self.regions:  # a root has no slots
            raise ConfigError(
                f"--cohort-size x --over-selection gives {self.slots} slots, fewer than --target-clients "
                f"{self.target_clients}: no round could ever fill"
            )

    def _check_tree(self) -> None:
        """What a tree of servers supports (docs/SCALING.md, "Hierarchical aggregation"): the mean,
        with per-update bounds at the regions, secure rounds or DP-FedAvg there (its noise at the
        root); the root takes no devices."""
        if self.regions and self.root:
            raise ConfigError("--regions (a root) and --root (a region) exclude each other: a tree has two levels")
        if self.regions < 0 or self.region < 0:
            raise ConfigError("--regions and --region must be >= 0")
        if self.regions and not self.min_clients <= self.regions:
            raise ConfigError(f"at a root, --min-clients counts regions' sums: at most --regions {self.regions}")
        if self.regions and (self.checkin_window or self.start_devices or self.secure.secagg):
            raise ConfigError("a root takes no devices: --checkin-window, --start-devices and --secagg belong to its "
                              "regions' servers")  # fmt: skip
        if self.regions and self.privacy.dp and not (self.round_timeout > 0 and self.privacy.dp_delta):
            raise ConfigError("--dp at a root needs --round-timeout > 0 (it publishes at its deadline) and --dp-delta "
                              "(it enrolls no devices to derive one from)")  # fmt: skip
        if self.root and not self.root.startswith(("http://", "https://")):
            raise ConfigError(f"--root must be an http:// or https:// URL, got {self.root[:60]!r}")
        if self.root and not self.region_token_file:
            raise ConfigError("a region needs --region-token-file (the root's region_tokens/region-K)")
        if self.privacy.dp and self.secure.secagg:
            raise ConfigError("--dp with --secagg is not built for a tree of servers (docs/SCALING.md)")
        a = self.aggregation
        if a.aggregate != "mean" or a.clip_factor or a.weight_cap or a.coordinate_clip:
            raise ConfigError(
                "a tree of servers adds plain sums (docs/SCALING.md): use --aggregate mean with --clip-factor 0 "
                "--weight-cap 0 --coordinate-clip 0 (each is relative to a whole round's medians, which no server of "
                "a tree sees) and bound each update with --max-update-norm instead"
            )

    def _check_privacy(self) -> None:
        """What the guarantee needs (docs/PRIVACY.md): devices drawn on their own coins at the end
        of a check-in window, a deadline at which every round is published, a mean."""
        if not (self.round_timeout > 0 and (self.checkin_window > 0 or self.regions)):
            raise ConfigError(
                "--dp needs --round-timeout > 0 and --checkin-window > 0: devices are drawn among those that "
                "checked in, and every round is published at its deadline"
            )
        self.privacy.require_mean(self.aggregation.aggregate)
        self.privacy.noise(self.cohort)  # a count noise too small for z is refused at start

    def _check_secure(self) -> None:
        """What a secure round needs (docs/SECAGG.md): a cohort fixed at the end of a check-in
        window, a deadline that leaves time for the three short stages and the training, and a
        plain mean (the server never sees an update, so it can neither clip nor trim one)."""
        stages = 3 * self.secure.secagg_stage_timeout
        if not (self.checkin_window > 0 and self.round_timeout > self.checkin_window + stages):
            raise ConfigError(
                f"--secagg needs --checkin-window > 0 and --round-timeout above the window plus 3 x "
                f"--secagg-stage-timeout ({stages:g} s) and the training's time"
            )
        if self.report_timeout or self.max_update_norm:
            raise ConfigError("--secagg's stages replace --report-timeout, and --max-update-norm needs the updates "
                              "in the clear: leave both 0")  # fmt: skip
        if self.aggregation.aggregate != "mean":
            raise ConfigError(f"--secagg sums the updates; --aggregate {self.aggregation.aggregate} needs each one")
        self.secure.check(self.slots)

    @property
    def cohort(self) -> int:
        """Devices a round wants reports from (``--cohort-size``, by default ``--target-clients``)."""
        return self.cohort_size or self.target_clients

    @property
    def slots(self) -> int:
        """Slots a round assigns: ceil(cohort x over-selection), computed without float noise."""
        return math.ceil(round(self.cohort * self.over_selection, 9))

    @property
    def trusted_proxies(self) -> list[str]:
        return [a.strip() for a in self.forwarded_allow_ips.split(",") if a.strip()]
