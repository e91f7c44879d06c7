package org.fedper.core;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * The device side of PROTOCOL.md v1. Network errors and 5xx are retried with backoff and jitter;
 * every other answer becomes a value or a ProtocolException carrying the server's code.
 */
public final class ProtocolClient {
  private final String server;
  private final HttpTransport http;
  private final Backoff backoff;
  private final Random rng;
  private final RoundBudget budget;
  private final int requestTimeoutMillis;
  private String token;

  /**
   * requestTimeoutMillis bounds each exchange (less when the budget has less left); every
   * backoff wait is the budget's, so retries never outlast it.
   */
  public ProtocolClient(String server, HttpTransport http, Backoff backoff, Random rng, RoundBudget budget,
      int requestTimeoutMillis) {
    this.server = server.endsWith("/") ? server.substring(0, server.length() - 1) : server;
    this.http = http;
    this.backoff = backoff;
    this.rng = rng;
    this.budget = budget;
    this.requestTimeoutMillis = requestTimeoutMillis;
  }

  public ProtocolClient(String server, HttpTransport http, Backoff backoff, Random rng, RoundBudget budget) {
    this(server, http, backoff, rng, budget, DEFAULT_TIMEOUT_MILLIS);
  }

  /** The phone's client: HttpURLConnection, the standard backoff, all within budget. */
  public ProtocolClient(String server, RoundBudget budget) {
    this(server, new HttpTransport.UrlConnection(DEFAULT_TIMEOUT_MILLIS), Backoff.standard(), new Random(), budget);
  }

  /** An exchange's limit when the budget has more left: a base of a few MB over slow Wi-Fi. */
  public static final int DEFAULT_TIMEOUT_MILLIS = 120_000;

  public void setToken(String token) {
    this.token = token;
  }

  /** The answer to a GET /v1/task: a task, or how long to wait (204 + Retry-After). */
  public static final class TaskOrWait {
    public final Task task;
    public final double retryAfterSeconds;

    TaskOrWait(Task task, double retryAfterSeconds) {
      this.task = task;
      this.retryAfterSeconds = retryAfterSeconds;
    }
  }

  /** A downloaded file, or null body when the cached copy's ETag is still current (304). */
  public static final class Download {
    public final byte[] body;
    public final String etag;

    Download(byte[] body, String etag) {
      this.body = body;
      this.etag = etag;
    }
  }

  /**
   * The platform's integrity token binding the server's nonce (protocol revision 1.8): Play
   * Integrity's with the nonce in its request, App Attest's with it in the client data.
   */
  public interface Attestor {
    String token(String nonce) throws Exception;
  }

  /** {deviceId, token}; the token is also kept for later calls. */
  public String[] enroll(String enrollmentKey, String platform) throws ProtocolException, InterruptedException {
    return enroll(enrollmentKey, platform, null);
  }

  /**
   * {deviceId, token}, enrolling with an attestation when attestor is not null: every attempt
   * takes a new nonce (POST /v1/devices/challenge), since the server uses one up per attempt.
   */
  public String[] enroll(String enrollmentKey, String platform, Attestor attestor)
      throws ProtocolException, InterruptedException {
    Map<String, String> headers = new LinkedHashMap<>();
    headers.put(Protocol.Header.CONTENT_TYPE, Protocol.Header.JSON);
    HttpTransport.Response r = null;
    String last = "";
    for (int attempt = 0; r == null && attempt < backoff.attempts; attempt++) {
      if (attempt > 0) {
        budget.sleep(backoff.delaySeconds(attempt - 1, rng), "backing off after " + last);
      }
      JSONObject req = new JSONObject();
      try {
        req.put(Protocol.Body.EnrollmentRequest.ENROLLMENT_KEY, enrollmentKey);
        req.put(Protocol.Body.EnrollmentRequest.PLATFORM, platform);
        if (attestor != null) {
          String nonce = challenge(enrollmentKey, headers);
          String token;
          try {
            token = attestor.token(nonce);
          } catch (InterruptedException ex) {
            throw ex;
          } catch (Exception ex) {
            throw new ProtocolException.Transient("the platform gave no attestation token: " + ex);
          }
          req.put(Protocol.Body.EnrollmentRequest.ATTESTATION, token);
          req.put(Protocol.Body.EnrollmentRequest.NONCE, nonce);
        }
      } catch (JSONException ex) {
        throw new IllegalArgumentException("enrollment key or platform is null", ex);
      }
      byte[] body = req.toString().getBytes(StandardCharsets.UTF_8);
      if (attestor == null) {
        r = send("POST", Protocol.Path.DEVICES, headers, body);
      } else {
        HttpTransport.Response once = sendOnce("POST", Protocol.Path.DEVICES, headers, body);
        if (once != null && once.status < 500) {
          r = once;
        }
        last = once == null ? "no answer from " + Protocol.Path.DEVICES : once.status + " from " + Protocol.Path.DEVICES;
      }
    }
    if (r == null) {
      throw new ProtocolException.Transient("gave up after " + backoff.attempts + " attempts: " + last);
    }
    if (r.status == 429) {
      throw new ProtocolException.Transient("enrollment rate-limited");
    }
    if (r.status != 201) {
      throw refused(r);
    }
    String[] ids = answer(r, "POST " + Protocol.Path.DEVICES, answer -> new String[] {
        answer.string(Protocol.Body.Enrolled.DEVICE_ID), answer.string(Protocol.Body.Enrolled.TOKEN)});
    token = ids[1];
    return ids;
  }

  private String challenge(String enrollmentKey, Map<String, String> headers)
      throws ProtocolException, InterruptedException, JSONException {
    JSONObject ask = new JSONObject();
    ask.put(Protocol.Body.ChallengeRequest.ENROLLMENT_KEY, enrollmentKey);
    HttpTransport.Response c =
        send("POST", Protocol.Path.CHALLENGE, headers, ask.toString().getBytes(StandardCharsets.UTF_8));
    if (c.status == 429) {
      throw new ProtocolException.Transient("attestation challenge rate-limited");
    }
    if (c.status != 201) {
      throw refused(c);
    }
    return answer(c, "POST " + Protocol.Path.CHALLENGE, answer -> answer.string(Protocol.Body.Challenge.NONCE));
  }

  public TaskOrWait task() throws ProtocolException, InterruptedException {
    return task(false);
  }

  /**
   * secagg: this device can take part in secure rounds, said in a header (Protocol.Header.SECAGG,
   * the revision 1.7 token: a server refuses a device that names only an earlier revision's layout).
   */
  public TaskOrWait task(boolean secagg) throws ProtocolException, InterruptedException {
    Map<String, String> extra = new LinkedHashMap<>();
    if (secagg) {
      extra.put(Protocol.Header.CAPABILITIES, Protocol.Header.SECAGG);
    }
    HttpTransport.Response r = send("GET", Protocol.Path.TASK, auth(extra), null);
    if (r.status == 410) {
      throw new ProtocolException.RunFinished();
    }
    if (r.status == 204) {
      return new TaskOrWait(null, retryAfter(r));
    }
    if (r.status != 200) {
      throw refused(r);
    }
    return new TaskOrWait(answer(r, "GET " + Protocol.Path.TASK, Task::new), 0);
  }

  public Download download(String path, String etag) throws ProtocolException, InterruptedException {
    Map<String, String> headers = auth(null);
    if (etag != null) {
      headers.put(Protocol.Header.IF_NONE_MATCH, etag);
    }
    HttpTransport.Response r = send("GET", path, headers, null);
    if (r.status == 304) {
      return new Download(null, etag);
    }
    if (r.status != 200) {
      throw refused(r);
    }
    String newEtag = r.header(Protocol.Header.ETAG);
    return new Download(r.body, newEtag == null ? "" : newEtag);
  }

  /** The file at path, checked against the sha256 the manifest (or task) promises. */
  public byte[] downloadVerified(String path, String sha256) throws ProtocolException, InterruptedException {
    byte[] body = download(path, null).body;
    if (!sha256Hex(body).equals(sha256)) {
      throw new ProtocolException(200, "sha256_mismatch", path + " does not match its sha256");
    }
    return body;
  }

  /**
   * Accepted-so-far count, or -1 when the server already had this device's update (409 duplicate);
   * 409 not_in_cohort is a NotInCohort carrying Retry-After; 408 and 409 upload_in_progress a
   * Transient; 410 RunFinished.
   */
  public long upload(long round, byte[] body) throws ProtocolException, InterruptedException {
    Map<String, String> headers = auth(null);
    headers.put(Protocol.Header.CONTENT_TYPE, Protocol.Header.OCTET_STREAM);
    HttpTransport.Response r = send("POST", Protocol.Path.UPDATES.replace("{round_number}", Long.toString(round)), headers, body);
    if (r.status == 202) {
      return answer(r, "POST " + Protocol.Path.UPDATES, answer -> answer.integer(Protocol.Body.Accepted.RECEIVED));
    }
    if (r.status == 410) {
      throw new ProtocolException.RunFinished();
    }
    if (r.status == 408) {
      throw new ProtocolException.Transient("the upload did not arrive within the server's upload deadline");
    }
    ProtocolException refused = refused(r);
    if (Protocol.ErrorCode.DUPLICATE_UPDATE.equals(refused.code)) {
      return -1; // our earlier upload was counted; its 202 was lost
    }
    if (Protocol.ErrorCode.NOT_IN_COHORT.equals(refused.code)) {
      // Revision 1.2: we hold no unexpired slot of the round's cohort. Not a failure:
      // wait Retry-After and ask for a task again.
      throw new ProtocolException.NotInCohort(retryAfter(r), refused.getMessage());
    }
    if (Protocol.ErrorCode.UPLOAD_IN_PROGRESS.equals(refused.code)) {
      // Revision 1.4: an earlier attempt of ours is still arriving at the server.
      throw new ProtocolException.Transient("an earlier upload of this device is still arriving");
    }
    throw refused;
  }

  /** This device's part of a secure round's stage (see the overload with headers). */
  public void secaggSend(String path, long round, byte[] body, boolean json)
      throws ProtocolException, InterruptedException {
    secaggSend(path, round, body, json, null);
  }

  /**
   * This device's part of a secure round's stage, with extra headers (the masked input's
   * Fedper-SecAgg-Unopened); a repeat the server already has is done too. Revision 1.7: a stage
   * that has not begun yet (409 secagg_stage_not_open, a device ahead of the slowest of its
   * cohort) is sent again after its Retry-After, within the budget.
   */
  public void secaggSend(String path, long round, byte[] body, boolean json, Map<String, String> extra)
      throws ProtocolException, InterruptedException {
    Map<String, String> headers = auth(extra);
    headers.put(Protocol.Header.CONTENT_TYPE, json ? Protocol.Header.JSON : Protocol.Header.OCTET_STREAM);
    String at = path.replace("{round_number}", Long.toString(round));
    while (true) {
      HttpTransport.Response r = send("POST", at, headers, body);
      if (r.status == 202) {
        return;
      }
      if (r.status == 410) {
        throw new ProtocolException.RunFinished();
      }
      ProtocolException refused = refused(r);
      if (Protocol.ErrorCode.SECAGG_STAGE_NOT_OPEN.equals(refused.code)) {
        budget.sleep(retryAfter(r), "waiting for the secure round's stage to begin (POST " + at + ")");
        continue;
      }
      if (!Protocol.ErrorCode.DUPLICATE_UPDATE.equals(refused.code)) {
        throw refused;
      }
      return;
    }
  }

  /** What the server relays for a stage, or null with retryAfter[0] set until it has it (204). */
  public JsonFields secaggFetch(String path, long round, double[] retryAfter)
      throws ProtocolException, InterruptedException {
    String at = path.replace("{round_number}", Long.toString(round));
    HttpTransport.Response r = send("GET", at, auth(null), null);
    if (r.status == 204) {
      retryAfter[0] = retryAfter(r);
      return null;
    }
    if (r.status == 410) {
      throw new ProtocolException.RunFinished();
    }
    if (r.status != 200) {
      throw refused(r);
    }
    return answer(r, "GET " + at, body -> body);
  }

  private Map<String, String> auth(Map<String, String> extra) {
    Map<String, String> headers = new LinkedHashMap<>();
    if (extra != null) {
      headers.putAll(extra);
    }
    if (token != null) {
      headers.put(Protocol.Header.AUTHORIZATION, "Bearer " + token);
    }
    return headers;
  }

  private HttpTransport.Response send(String method, String path, Map<String, String> headers, byte[] body)
      throws ProtocolException, InterruptedException {
    String last = "";
    for (int attempt = 0; attempt < backoff.attempts; attempt++) {
      if (attempt > 0) {
        budget.sleep(backoff.delaySeconds(attempt - 1, rng), "backing off after " + last);
      }
      int timeout = budget.timeoutMillis(requestTimeoutMillis, method + " " + path);
      try {
        HttpTransport.Response r = http.send(method, server + path, headers, body, timeout);
        if (r.status < 500) {
          return r;
        }
        last = r.status + " from " + path;
      } catch (IOException ex) {
        last = ex.toString();
      }
    }
    throw new ProtocolException.Transient("gave up after " + backoff.attempts + " attempts: " + last);
  }

  /** One attempt, no retry (a request whose body cannot be sent twice); null when no answer came. */
  private HttpTransport.Response sendOnce(String method, String path, Map<String, String> headers, byte[] body)
      throws ProtocolException, InterruptedException {
    int timeout = budget.timeoutMillis(requestTimeoutMillis, method + " " + path);
    try {
      return http.send(method, server + path, headers, body, timeout);
    } catch (IOException ex) {
      return null;
    }
  }

  private static ProtocolException refused(HttpTransport.Response r) {
    String code;
    String message;
    try {
      JsonFields body = JsonFields.parse(text(r), "the server's error answer");
      code = body.string(Protocol.Body.Error.CODE, "?");
      message = body.string(Protocol.Body.Error.MESSAGE, "");
    } catch (IllegalArgumentException ex) {
      String t = text(r);
      code = "?";
      message = t.length() > 200 ? t.substring(0, 200) : t;
    }
    return r.status == 401 ? new ProtocolException.Unauthorized(code, message) : new ProtocolException(r.status, code, message);
  }

  /** Retry-After in seconds; 5 when absent or not a number (the server sends whole seconds). */
  static double retryAfter(HttpTransport.Response r) {
    String value = r.header(Protocol.Header.RETRY_AFTER);
    try {
      double s = value == null ? 5.0 : Double.parseDouble(value.trim());
      return Double.isFinite(s) ? Math.max(0, s) : 5.0;
    } catch (NumberFormatException ex) {
      return 5.0;
    }
  }

  /** A 2xx answer's JSON body, read; a malformed one is a ProtocolException naming the call. */
  private static <T> T answer(HttpTransport.Response r, String call, java.util.function.Function<JsonFields, T> read)
      throws ProtocolException {
    try {
      return read.apply(JsonFields.parse(text(r), "the answer to " + call));
    } catch (IllegalArgumentException | ArithmeticException ex) {
      throw new ProtocolException(r.status, "bad_answer", ex.getMessage());
    }
  }

  private static String text(HttpTransport.Response r) {
    return new String(r.body, StandardCharsets.UTF_8);
  }

  public static String sha256Hex(byte[] data) {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(data);
      StringBuilder out = new StringBuilder();
      for (byte b : d) {
        out.append(String.format("%02x", b));
      }
      return out.toString();
    } catch (NoSuchAlgorithmException ex) {
      throw new IllegalStateException(ex);
    }
  }
}
