package org.fedper.core;

/** The device protocol v1 (revision 1.9): generated from
 * docs/protocol.schema.json by android_demo/core/generate_protocol.py; do not edit. */
public final class Protocol {
  private Protocol() {}

  public static final class Path {
    private Path() {}

    public static final String ADMIN_DEVICES = "/v1/admin/devices";
    public static final String ADMIN_LATEST_BASE = "/v1/admin/models/latest/base";
    public static final String ADMIN_REVOKE = "/v1/admin/devices/{device_id}/revoke";
    public static final String ADMIN_ROLLBACK = "/v1/admin/rollback/{version}";
    public static final String ADMIN_STOP = "/v1/admin/stop";
    public static final String ARTIFACT = "/v1/artifacts/{name}";
    public static final String CHALLENGE = "/v1/devices/challenge";
    public static final String DEVICES = "/v1/devices";
    public static final String HEALTH = "/v1/health";
    public static final String MODEL_BASE = "/v1/models/{version}/base";
    public static final String REGION = "/v1/regions/{region}";
    public static final String REGION_SUM = "/v1/rounds/{round_number}/regions/{region}";
    public static final String ROUND = "/v1/rounds/{round_number}";
    public static final String SECAGG_KEYS = "/v1/rounds/{round_number}/secagg/keys";
    public static final String SECAGG_MASKED = "/v1/rounds/{round_number}/secagg/masked";
    public static final String SECAGG_SHARES = "/v1/rounds/{round_number}/secagg/shares";
    public static final String SECAGG_UNMASK = "/v1/rounds/{round_number}/secagg/unmask";
    public static final String STATUS = "/v1/status";
    public static final String TASK = "/v1/task";
    public static final String UPDATES = "/v1/rounds/{round_number}/updates";
  }

  public static final class Metadata {
    private Metadata() {}

    public static final String BASE_VERSION = "base_version";
    public static final String COUNT = "sum_count";
    public static final String FRACTION_METRIC_PATTERN = "([a-z0-9]+_)*accuracy(_[a-z0-9]+)*";
    public static final int MAX_METRICS = 16;
    public static final double MAX_METRIC_ABS = 1000000000.0;
    public static final String METRIC_NAME_PATTERN = "[a-z0-9_]{1,64}";
    public static final String METRIC_PREFIX = "metric.";
    public static final String NON_NEGATIVE_METRIC_PATTERN = "([a-z0-9]+_)*loss(_[a-z0-9]+)*";
    public static final String NUM_SAMPLES = "num_samples";
    public static final String REGION = "sum_region";
    public static final String UNCLIPPED = "dp_unclipped";
    public static final String WEIGHT = "sum_weight";
  }

  public static final class Header {
    private Header() {}

    public static final String AUTHORIZATION = "Authorization";
    public static final String CAPABILITIES = "Fedper-Capabilities";
    public static final String CONTENT_TYPE = "Content-Type";
    public static final String ETAG = "ETag";
    public static final String IF_NONE_MATCH = "If-None-Match";
    public static final String JSON = "application/json";
    public static final String OCTET_STREAM = "application/octet-stream";
    public static final String RETRY_AFTER = "Retry-After";
    public static final String SECAGG = "secagg-1.7";
    public static final String SECAGG_UNOPENED = "Fedper-SecAgg-Unopened";
  }

  public static final class Env {
    private Env() {}

    public static final String ADMIN_TOKEN = "FEDPER_ADMIN_TOKEN";
    public static final String ENROLLMENT_KEY = "FEDPER_ENROLLMENT_KEY";
  }

  public static final class ErrorCode {
    private ErrorCode() {}

    public static final String ATTESTATION_FAILED = "attestation_failed";
    public static final String BAD_METADATA = "bad_metadata";
    public static final String BAD_REGIONAL_SUM = "bad_regional_sum";
    public static final String BAD_REQUEST = "bad_request";
    public static final String BAD_SECAGG_MESSAGE = "bad_secagg_message";
    public static final String DELTA_ABOVE_CLIP = "delta_above_clip";
    public static final String DUPLICATE_UPDATE = "duplicate_update";
    public static final String FORBIDDEN = "forbidden";
    public static final String HEADER_TIMEOUT = "header_timeout";
    public static final String INTERNAL_ERROR = "internal_error";
    public static final String MALFORMED_JSON = "malformed_json";
    public static final String MALFORMED_SAFETENSORS = "malformed_safetensors";
    public static final String METHOD_NOT_ALLOWED = "method_not_allowed";
    public static final String MISSING_TENSOR = "missing_tensor";
    public static final String NON_FINITE = "non_finite";
    public static final String NOT_FOUND = "not_found";
    public static final String NOT_IN_COHORT = "not_in_cohort";
    public static final String NUM_SAMPLES_OUT_OF_RANGE = "num_samples_out_of_range";
    public static final String PAYLOAD_TOO_LARGE = "payload_too_large";
    public static final String PERSONAL_TENSOR_IN_UPLOAD = "personal_tensor_in_upload";
    public static final String PRIVACY_BUDGET_SPENT = "privacy_budget_spent";
    public static final String RATE_LIMITED = "rate_limited";
    public static final String ROUND_NOT_OPEN = "round_not_open";
    public static final String RUN_FINISHED = "run_finished";
    public static final String SECAGG_STAGE_CLOSED = "secagg_stage_closed";
    public static final String SECAGG_STAGE_NOT_OPEN = "secagg_stage_not_open";
    public static final String SECAGG_UNSUPPORTED = "secagg_unsupported";
    public static final String SECURE_ROUND = "secure_round";
    public static final String SERVER_BUSY = "server_busy";
    public static final String STALE_BASE_VERSION = "stale_base_version";
    public static final String UNAUTHORIZED = "unauthorized";
    public static final String UNEXPECTED_TENSOR = "unexpected_tensor";
    public static final String UPDATE_OUT_OF_BOUNDS = "update_out_of_bounds";
    public static final String UPLOAD_IN_PROGRESS = "upload_in_progress";
    public static final String UPLOAD_TIMEOUT = "upload_timeout";
    public static final String WRONG_DTYPE = "wrong_dtype";
    public static final String WRONG_SHAPE = "wrong_shape";
  }

  public static final class Body {
    private Body() {}

    public static final class Accepted {
      private Accepted() {}

      public static final String ACCEPTED = "accepted";
      public static final String RECEIVED = "received";
      public static final String ROUND = "round";
    }

    public static final class Challenge {
      private Challenge() {}

      public static final String EXPIRES_IN = "expires_in";
      public static final String NONCE = "nonce";
    }

    public static final class ChallengeRequest {
      private ChallengeRequest() {}

      public static final String ENROLLMENT_KEY = "enrollment_key";
    }

    public static final class DPTask {
      private DPTask() {}

      public static final String CLIP_NORM = "clip_norm";
    }

    public static final class Enrolled {
      private Enrolled() {}

      public static final String DEVICE_ID = "device_id";
      public static final String TOKEN = "token";
    }

    public static final class EnrollmentRequest {
      private EnrollmentRequest() {}

      public static final String ATTESTATION = "attestation";
      public static final String ENROLLMENT_KEY = "enrollment_key";
      public static final String NONCE = "nonce";
      public static final String PLATFORM = "platform";
    }

    public static final class Error {
      private Error() {}

      public static final String CODE = "code";
      public static final String MESSAGE = "message";
      public static final String REQUEST_ID = "request_id";
    }

    public static final class Health {
      private Health() {}

      public static final String PROTOCOL = "protocol";
      public static final String STATUS = "status";
    }

    public static final class MetricSummary {
      private MetricSummary() {}

      public static final String COUNT = "count";
      public static final String MEAN = "mean";
      public static final String STD = "std";
      public static final String WEIGHTED_MEAN = "weighted_mean";
    }

    public static final class PrivacySpent {
      private PrivacySpent() {}

      public static final String CLIP_NORM = "clip_norm";
      public static final String DELTA = "delta";
      public static final String EPSILON = "epsilon";
      public static final String NOISE_MULTIPLIER = "noise_multiplier";
      public static final String ROUNDS = "rounds";
      public static final String SAMPLING_PROBABILITY = "sampling_probability";
      public static final String TARGET_EPSILON = "target_epsilon";
    }

    public static final class ProvisionRequest {
      private ProvisionRequest() {}

      public static final String COUNT = "count";
      public static final String PLATFORM = "platform";
    }

    public static final class Provisioned {
      private Provisioned() {}

      public static final String DEVICES = "devices";
    }

    public static final class RegionAccepted {
      private RegionAccepted() {}

      public static final String REGION = "region";
      public static final String REGIONS_IN = "regions_in";
      public static final String ROUND = "round";
    }

    public static final class RegionView {
      private RegionView() {}

      public static final String DEADLINE = "deadline";
      public static final String DP_CLIP = "dp_clip";
      public static final String DP_SAMPLING_PROBABILITY = "dp_sampling_probability";
      public static final String FINISHED = "finished";
      public static final String FORWARDED = "forwarded";
      public static final String MODEL_VERSION = "model_version";
      public static final String REGION = "region";
      public static final String REGIONS = "regions";
      public static final String ROUND = "round";
    }

    public static final class Revoked {
      private Revoked() {}

      public static final String DEVICE_ID = "device_id";
      public static final String REVOKED = "revoked";
      public static final String UPDATE_WITHDRAWN = "update_withdrawn";
    }

    public static final class RolledBack {
      private RolledBack() {}

      public static final String MODEL_VERSION = "model_version";
      public static final String ROLLED_BACK_TO = "rolled_back_to";
      public static final String ROUND = "round";
    }

    public static final class RoundInfo {
      private RoundInfo() {}

      public static final String DEADLINE = "deadline";
      public static final String METRICS = "metrics";
      public static final String MIN_CLIENTS = "min_clients";
      public static final String MODEL_VERSION = "model_version";
      public static final String REASON = "reason";
      public static final String RECEIVED = "received";
      public static final String RESULT_VERSION = "result_version";
      public static final String ROUND = "round";
      public static final String STATE = "state";
      public static final String TARGET_CLIENTS = "target_clients";
    }

    public static final class SecAggAccepted {
      private SecAggAccepted() {}

      public static final String ROUND = "round";
      public static final String STAGE = "stage";
    }

    public static final class SecAggKeys {
      private SecAggKeys() {}

      public static final String CHANNEL_KEY = "channel_key";
      public static final String MASK_KEY = "mask_key";
    }

    public static final class SecAggNeighbours {
      private SecAggNeighbours() {}

      public static final String NEIGHBOURS = "neighbours";
      public static final String THRESHOLD = "threshold";
    }

    public static final class SecAggSealed {
      private SecAggSealed() {}

      public static final String SHARES = "shares";
    }

    public static final class SecAggTask {
      private SecAggTask() {}

      public static final String CLIP_NORM = "clip_norm";
      public static final String COHORT = "cohort";
      public static final String KEYS_BY = "keys_by";
      public static final String MASKED_BY = "masked_by";
      public static final String NEIGHBOURS = "neighbours";
      public static final String SESSION = "session";
      public static final String SHARES_BY = "shares_by";
      public static final String THRESHOLD = "threshold";
      public static final String UNMASK_BY = "unmask_by";
      public static final String WEIGHT_CAP = "weight_cap";
    }

    public static final class SecAggUnmaskAnswer {
      private SecAggUnmaskAnswer() {}

      public static final String SHARES = "shares";
    }

    public static final class SecAggUnmaskRequest {
      private SecAggUnmaskRequest() {}

      public static final String DROPPED = "dropped";
      public static final String SURVIVORS = "survivors";
    }

    public static final class Status {
      private Status() {}

      public static final String DEVICES = "devices";
      public static final String DRAINING = "draining";
      public static final String MODEL_VERSION = "model_version";
      public static final String PRIVACY = "privacy";
      public static final String ROUND = "round";
      public static final String ROUNDS_CLOSED = "rounds_closed";
      public static final String ROUNDS_TOTAL = "rounds_total";
      public static final String STATE = "state";
    }

    public static final class Stopped {
      private Stopped() {}

      public static final String STATE = "state";
    }

    public static final class Task {
      private Task() {}

      public static final String BASE_URL = "base_url";
      public static final String CONFIG = "config";
      public static final String DEADLINE = "deadline";
      public static final String DP = "dp";
      public static final String MANIFEST_SHA256 = "manifest_sha256";
      public static final String MANIFEST_URL = "manifest_url";
      public static final String MODEL_VERSION = "model_version";
      public static final String REPORT_BY = "report_by";
      public static final String ROUND = "round";
      public static final String SECAGG = "secagg";
    }

    public static final class TaskConfig {
      private TaskConfig() {}

      public static final String BATCH_SIZE = "batch_size";
      public static final String LEARNING_RATE = "learning_rate";
      public static final String LOCAL_EPOCHS = "local_epochs";
      public static final String MOMENTUM = "momentum";
    }
  }
}
