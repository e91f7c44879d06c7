"""The device protocol (docs/PROTOCOL.md, version 1) as code: the one place that names it.

Every JSON body as a pydantic model, every error code, metadata key, header, path and
environment variable. The server answers with these models and the Python device parses
them; ``docs/protocol.schema.json`` is generated from this module (``python -m
fedper.common.protocol``) and the Java core's ``Protocol.java`` is checked against it, so the three
cannot drift apart without a test failing.
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import asdict, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fedper.common.train_config import TrainConfig

AnyTrainConfig = TypeVar("AnyTrainConfig", bound=TrainConfig)

VERSION = 1
REVISION = "1.9"
PREFIX = "/v1"


class Route:
    """Endpoint paths; ``{...}`` marks a path parameter."""

    HEALTH = f"{PREFIX}/health"
    DEVICES = f"{PREFIX}/devices"
    # A single-use nonce for the platform's attestation (docs/SERVER.md).
    CHALLENGE = f"{PREFIX}/devices/challenge"
    TASK = f"{PREFIX}/task"
    MODEL_BASE = f"{PREFIX}/models/{{version}}/base"
    ARTIFACT = f"{PREFIX}/artifacts/{{name}}"
    ROUND = f"{PREFIX}/rounds/{{round_number}}"
    UPDATES = f"{PREFIX}/rounds/{{round_number}}/updates"
    STATUS = f"{PREFIX}/status"
    ADMIN_REVOKE = f"{PREFIX}/admin/devices/{{device_id}}/revoke"
    ADMIN_STOP = f"{PREFIX}/admin/stop"
    ADMIN_LATEST_BASE = f"{PREFIX}/admin/models/latest/base"
    ADMIN_ROLLBACK = f"{PREFIX}/admin/rollback/{{version}}"
    ADMIN_DEVICES = f"{PREFIX}/admin/devices"  # enroll devices in bulk
    # A secure round's stages (docs/SECAGG.md): POST sends this device's
    # part, GET fetches what the server relays to it (204 until the stage before it ends).
    SECAGG_KEYS = f"{PREFIX}/rounds/{{round_number}}/secagg/keys"
    SECAGG_SHARES = f"{PREFIX}/rounds/{{round_number}}/secagg/shares"
    SECAGG_MASKED = f"{PREFIX}/rounds/{{round_number}}/secagg/masked"
    SECAGG_UNMASK = f"{PREFIX}/rounds/{{round_number}}/secagg/unmask"
    # Revision 1.9, server to server: a regional server's sum for the root's round, and what the
    # root tells a region (docs/PROTOCOL.md, "Regional aggregation").
    REGION_SUM = f"{PREFIX}/rounds/{{round_number}}/regions/{{region}}"
    REGION = f"{PREFIX}/regions/{{region}}"


class ErrorCode(StrEnum):
    """The ``code`` of every error body, by status."""

    BAD_REQUEST = "bad_request"  # 400
    MALFORMED_JSON = "malformed_json"  # 400
    MALFORMED_SAFETENSORS = "malformed_safetensors"  # 400
    UNAUTHORIZED = "unauthorized"  # 401
    FORBIDDEN = "forbidden"  # 403
    ATTESTATION_FAILED = "attestation_failed"  # 403
    SECAGG_UNSUPPORTED = "secagg_unsupported"  # 403
    NOT_FOUND = "not_found"  # 404
    METHOD_NOT_ALLOWED = "method_not_allowed"  # 405
    UPLOAD_TIMEOUT = "upload_timeout"  # 408
    HEADER_TIMEOUT = "header_timeout"  # 408, from the HTTP layer
    DUPLICATE_UPDATE = "duplicate_update"  # 409
    ROUND_NOT_OPEN = "round_not_open"  # 409
    STALE_BASE_VERSION = "stale_base_version"  # 409
    NOT_IN_COHORT = "not_in_cohort"  # 409
    UPLOAD_IN_PROGRESS = "upload_in_progress"  # 409
    SECAGG_STAGE_CLOSED = "secagg_stage_closed"  # 409: out of this secure round
    SECAGG_STAGE_NOT_OPEN = "secagg_stage_not_open"  # 409: too early; Retry-After says when
    SECURE_ROUND = "secure_round"  # 409: a plain upload into a secure round
    PRIVACY_BUDGET_SPENT = "privacy_budget_spent"  # 409: a rollback past --target-epsilon
    RUN_FINISHED = "run_finished"  # 410
    PAYLOAD_TOO_LARGE = "payload_too_large"  # 413
    MISSING_TENSOR = "missing_tensor"  # 422
    UNEXPECTED_TENSOR = "unexpected_tensor"  # 422
    WRONG_SHAPE = "wrong_shape"  # 422
    WRONG_DTYPE = "wrong_dtype"  # 422
    NON_FINITE = "non_finite"  # 422
    NUM_SAMPLES_OUT_OF_RANGE = "num_samples_out_of_range"  # 422
    BAD_METADATA = "bad_metadata"  # 422
    PERSONAL_TENSOR_IN_UPLOAD = "personal_tensor_in_upload"  # 422
    UPDATE_OUT_OF_BOUNDS = "update_out_of_bounds"  # 422
    DELTA_ABOVE_CLIP = "delta_above_clip"  # 422
    BAD_SECAGG_MESSAGE = "bad_secagg_message"  # 422
    BAD_REGIONAL_SUM = "bad_regional_sum"  # 422: a region's sum with the wrong content (revision 1.9)
    RATE_LIMITED = "rate_limited"  # 429
    INTERNAL_ERROR = "internal_error"  # 500
    SERVER_BUSY = "server_busy"  # 503


class Metadata:
    """Keys of an update's safetensors ``__metadata__`` (values are strings)."""

    NUM_SAMPLES = "num_samples"
    BASE_VERSION = "base_version"
    METRIC_PREFIX = "metric."
    METRIC_NAME_PATTERN = r"[a-z0-9_]{1,64}"
    MAX_METRICS = 16
    MAX_METRIC_ABS = 1e9
    # Metrics bounded to their meaning, by the words of their names.
    FRACTION_METRIC_PATTERN = r"([a-z0-9]+_)*accuracy(_[a-z0-9]+)*"  # in [0, 1]
    NON_NEGATIVE_METRIC_PATTERN = r"([a-z0-9]+_)*loss(_[a-z0-9]+)*"  # >= 0
    # In a round whose task carries ``dp``: "1" if the base delta's norm was within the clip
    # before clipping, else "0" (adaptive clipping counts them); required there, refused elsewhere.
    UNCLIPPED = "dp_unclipped"
    # A regional sum's (revision 1.9, fedper.common.hierarchical), besides BASE_VERSION.
    REGION = "sum_region"
    WEIGHT = "sum_weight"
    COUNT = "sum_count"


class Header:
    AUTHORIZATION = "Authorization"
    CONTENT_TYPE = "Content-Type"
    JSON = "application/json"
    RETRY_AFTER = "Retry-After"
    ETAG = "ETag"
    IF_NONE_MATCH = "If-None-Match"
    OCTET_STREAM = "application/octet-stream"
    # What a device can do, comma-separated, on GET /v1/task: "secagg-1.7" if it can take part in
    # a secure round as docs/SECAGG.md defines it to the byte. A device of protocol revision 1.6
    # sends "secagg" and seals its shares in another layout: a secure server refuses it.
    CAPABILITIES = "Fedper-Capabilities"
    SECAGG = "secagg-1.7"
    # On POST .../secagg/masked: the ids of the neighbours whose sealed shares
    # this device could not open, comma-separated (absent: none). It holds no share of them and
    # added no pairwise mask with them.
    SECAGG_UNOPENED = "Fedper-SecAgg-Unopened"


class Env:
    ADMIN_TOKEN = "FEDPER_ADMIN_TOKEN"
    ENROLLMENT_KEY = "FEDPER_ENROLLMENT_KEY"


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)  # additions are compatible (PROTOCOL.md)


class Health(_Body):
    status: Literal["ok"] = "ok"
    protocol: int = VERSION


MAX_ATTESTATION_LENGTH = 16 * 1024
MAX_PLATFORM_LENGTH = 128


NONCE_PATTERN = r"^[0-9a-f]{32}$"


class EnrollmentRequest(_Body):
    enrollment_key: str
    platform: str | None = Field(default=None, max_length=MAX_PLATFORM_LENGTH)
    # The platform's integrity token (e.g. Play Integrity), for a server
    # configured to verify one (docs/SERVER.md, "Device attestation").
    attestation: str | None = Field(default=None, max_length=MAX_ATTESTATION_LENGTH)
    # The nonce POST /v1/devices/challenge gave, which the attestation token
    # binds (the platform's request carries it); required with an attestation, used once.
    nonce: str | None = Field(default=None, pattern=NONCE_PATTERN)


class ChallengeRequest(_Body):
    """Asking for an attestation nonce takes the enrollment key, as enrolling does."""

    enrollment_key: str


class Challenge(_Body):
    """A nonce for one enrollment's attestation, valid ``expires_in`` seconds."""

    nonce: str = Field(pattern=NONCE_PATTERN)
    expires_in: int


class Enrolled(_Body):
    device_id: str
    token: str


# TrainConfig's fields, each optional on the wire (tests/unit/core/test_cli.py holds the two to the same names
# and types). A comment, not the docstring: the schema carries the docstring.
class TaskConfig(_Body):
    """Overrides the manifest's training defaults key by key (an absent key keeps the default)."""

    local_epochs: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    momentum: float | None = None

    @classmethod
    def asking(cls, config: TrainConfig) -> TaskConfig:
        """The task config that asks for every setting of ``config``."""
        return cls(**asdict(config))

    def over(self, defaults: AnyTrainConfig) -> AnyTrainConfig:
        """``defaults`` with the keys this config gives; checked as ``defaults`` is."""
        return replace(defaults, **self.model_dump(include=set(type(self).model_fields), exclude_none=True))


class DPTask(_Body):
    """The round runs DP-FedAvg (docs/PRIVACY.md). The device clips its base delta (trained base
    minus the base it received) to L2 norm ``clip_norm`` as PROTOCOL.md, "Clipping the base
    delta", defines it, and says in its update's metadata whether it had to."""

    clip_norm: float = Field(gt=0)


class SecAggTask(_Body):
    """The round is securely aggregated (docs/SECAGG.md). ``session`` names the round in every
    key the devices derive; the device encodes its clipped, weighted base delta
    as ``FixedPoint(clip_norm, cohort, weight_cap)`` and takes part in the stages before their
    deadlines (ISO 8601 UTC): its keys by ``keys_by``, its shares by ``shares_by``, its masked
    input by ``masked_by`` and its unmasking answer by ``unmask_by`` (the round's deadline)."""

    session: str = Field(pattern=r"^[0-9a-f]{32}$")
    cohort: int = Field(ge=1)
    neighbours: int = Field(ge=1)
    threshold: int = Field(ge=1)
    clip_norm: float = Field(gt=0)
    weight_cap: int = Field(ge=1)
    keys_by: str
    shares_by: str
    masked_by: str
    unmask_by: str


class Task(_Body):
    round: int
    model_version: int
    deadline: str | None
    base_url: str
    manifest_url: str
    manifest_sha256: str
    config: TaskConfig = TaskConfig()
    # When this device's slot in the round's cohort expires (ISO 8601 UTC);
    # an update that arrives later is refused (409 not_in_cohort); the device asks again.
    # Null when the slot lasts as long as the round.
    report_by: str | None = None
    # Set when the server runs DP-FedAvg; a device that cannot clip must not
    # upload (the server refuses an update whose delta is longer than the clip).
    dp: DPTask | None = None
    # Set in a securely aggregated round, given only to a device that sent the ``secagg-1.7``
    # capability (``Header.SECAGG``).
    secagg: SecAggTask | None = None


class SecAggKeys(_Body):
    """A device's two X25519 public keys for the round, 32 raw bytes each in base64."""

    channel_key: str = Field(max_length=64)
    mask_key: str = Field(max_length=64)


class SecAggNeighbours(_Body):
    """The keys of the device's neighbours that advertised, by device id."""

    threshold: int
    neighbours: dict[str, SecAggKeys]


class SecAggSealed(_Body):
    """Sealed share messages (base64): POSTed by device id of the receiver, fetched by the sender's."""

    shares: dict[str, str]


class SecAggUnmaskRequest(_Body):
    """Whose mask keys (``dropped``) and seeds (``survivors``) the server asks this device for."""

    dropped: list[str]
    survivors: list[str]


class SecAggUnmaskAnswer(_Body):
    """The device's shares (base64) for each device named in the request."""

    shares: dict[str, str]


class SecAggAccepted(_Body):
    round: int
    stage: Literal["keys", "shares", "masked", "unmask"]


class Accepted(_Body):
    round: int
    accepted: bool
    received: int


class RegionAccepted(_Body):
    """A region's sum is in the root's round (202; the same bytes again answer the same)."""

    round: int
    region: int
    regions_in: int  # sums the round holds now


class RegionView(_Body):
    """What the root tells region ``region``: its open round (null: none), the version that round
    trains, whether this region's sum is in it, and whether the run is finished."""

    region: int
    regions: int
    round: int | None
    model_version: int
    deadline: str | None
    forwarded: bool
    finished: bool
    # Under DP-FedAvg at the root: the round's clip, which the region's tasks carry, and the
    # sampling probability its draws must use (null: no DP).
    dp_clip: float | None = None
    dp_sampling_probability: float | None = None


class MetricSummary(_Body):
    mean: float
    weighted_mean: float
    std: float
    count: int


class RoundInfo(_Body):
    round: int
    state: Literal["open", "closed", "abandoned", "stopped"]
    model_version: int
    received: int
    min_clients: int
    target_clients: int
    result_version: int | None
    deadline: str | None
    metrics: dict[str, MetricSummary]
    # Why an abandoned round published nothing, when the server knows (too few devices, a
    # secure round's masks that could not be removed, a sum out of bounds, ...).
    reason: str | None = None


class PrivacySpent(_Body):
    """What the run's DP-FedAvg has spent (docs/PRIVACY.md, "The accounting")."""

    epsilon: float | None  # at ``delta`` after ``rounds`` noised rounds; null: no noise (infinite)
    delta: float
    rounds: int
    noise_multiplier: float
    sampling_probability: float
    clip_norm: float  # the open round's
    target_epsilon: float | None


class Status(_Body):
    state: Literal["running", "finished"]
    round: int
    model_version: int
    rounds_total: int
    rounds_closed: int
    devices: int
    draining: bool = False  # the disk is full; downloads only, no uploads
    privacy: PrivacySpent | None = None  # under DP-FedAvg


MAX_PROVISION = 10_000  # devices one POST /v1/admin/devices enrolls


class ProvisionRequest(_Body):
    """The operator enrolls ``count`` devices at once (no enrollment key, no attestation, no rate
    limit: it holds the admin token)."""

    count: int = Field(ge=1, le=MAX_PROVISION)
    platform: str | None = Field(default=None, max_length=MAX_PLATFORM_LENGTH)


class Provisioned(_Body):
    devices: list[Enrolled]


class Revoked(_Body):
    device_id: str
    revoked: bool
    update_withdrawn: bool


class Stopped(_Body):
    state: Literal["finished"] = "finished"


class RolledBack(_Body):
    """The run goes on from a copy of version ``rolled_back_to``."""

    rolled_back_to: int
    model_version: int  # the new version (a copy of ``rolled_back_to``)
    round: int  # the round that now trains it


class Error(_Body):
    code: str
    message: str
    request_id: str | None = None  # on 500 internal_error


class OctetsError(ValueError):
    """A JSON string that should carry bytes is not strict base64."""


def octets_text(data: bytes) -> str:
    """Raw bytes (keys, sealed shares) as a JSON string: standard base64 with padding."""
    return base64.b64encode(data).decode()


def octets(text: str) -> bytes:
    """The bytes a JSON string carries; OctetsError unless it is strict base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:  # binascii.Error, and ValueError for non-ASCII text
        raise OctetsError(f"not base64: {e}") from e


MODELS: tuple[type[BaseModel], ...] = (
    Health, EnrollmentRequest, ChallengeRequest, Challenge, Enrolled, TaskConfig, DPTask, SecAggTask, Task,
    SecAggKeys, SecAggNeighbours, SecAggSealed, SecAggUnmaskRequest, SecAggUnmaskAnswer, SecAggAccepted, Accepted,
    RegionAccepted, RegionView,
    MetricSummary, RoundInfo, PrivacySpent, Status, ProvisionRequest, Provisioned, Revoked, Stopped, RolledBack,
    Error,
)  # fmt: skip
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json"


def _constants(cls: type) -> dict[str, Any]:
    return {k: v for k, v in vars(cls).items() if k.isupper()}


def schema() -> dict[str, Any]:
    """JSON Schema of every body, plus the protocol's constants (what other languages read)."""
    defs: dict[str, Any] = {}
    for model in MODELS:
        one = TypeAdapter(model).json_schema(ref_template="#/$defs/{model}")
        defs.update(one.pop("$defs", {}))
        defs[model.__name__] = one
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"FedPer device protocol v{VERSION} (revision {REVISION})",
        "description": "Generated by `python -m fedper.common.protocol` from fedper/common/protocol.py; do not edit.",
        "$defs": defs,
        "x-fedper": {
            "version": VERSION,
            "revision": REVISION,
            "error_codes": [c.value for c in ErrorCode],
            "paths": _constants(Route),
            "metadata": _constants(Metadata),
            "headers": _constants(Header),
            "env": _constants(Env),
        },
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_text())
    print(f"wrote {SCHEMA_FILE}", file=sys.stderr)
