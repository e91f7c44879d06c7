package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.Test;

/** Retries, Retry-After, 409 duplicate_update and 410, against scripted answers. */
public class ProtocolClientTest {
  /** Answers from a script; an entry of null means "connection refused". */
  static final class Scripted implements HttpTransport {
    final Deque<Response> answers = new ArrayDeque<>();
    final List<String> calls = new ArrayList<>();
    final List<Map<String, String>> headers = new ArrayList<>();
    final List<String> bodies = new ArrayList<>();

    Scripted then(int status, String body, String... headers) {
      Map<String, String> h = new LinkedHashMap<>();
      for (int k = 0; k < headers.length; k += 2) {
        h.put(headers[k].toLowerCase(), headers[k + 1]);
      }
      answers.add(new Response(status, h, body.getBytes(StandardCharsets.UTF_8)));
      return this;
    }

    Scripted thenRefused() {
      answers.add(new Response(-1, Collections.emptyMap(), new byte[0]));
      return this;
    }

    @Override
    public Response send(String method, String url, Map<String, String> headers, byte[] body) throws IOException {
      calls.add(method + " " + url + " " + headers.getOrDefault("If-None-Match", ""));
      this.headers.add(new LinkedHashMap<>(headers));
      bodies.add(body == null ? "" : new String(body, StandardCharsets.UTF_8));
      Response r = answers.removeFirst();
      if (r.status == -1) {
        throw new IOException("connection refused");
      }
      return r;
    }
  }

  private final List<Double> slept = new ArrayList<>();

  private ProtocolClient client(Scripted http) {
    return new ProtocolClient("http://server", http, new Backoff(0.5, 30, 4), new Random(0), RoundBudget.unlimited(slept::add));
  }

  @Test
  public void retriesNetworkErrorsAnd5xxWithGrowingJitteredWaits() throws Exception {
    Scripted http = new Scripted().thenRefused().then(503, "{}").thenRefused()
        .then(200, "{\"round\":3,\"model_version\":2,\"deadline\":null,\"base_url\":\"/v1/models/2/base\","
            + "\"manifest_url\":\"/v1/artifacts/manifest.json\",\"manifest_sha256\":\"x\",\"config\":{\"local_epochs\":2}}");
    ProtocolClient.TaskOrWait t = client(http).task();
    assertEquals(3, t.task.round);
    assertEquals(2L, ((Number) t.task.config.get("local_epochs")).longValue());
    assertEquals(3, slept.size());
    for (int k = 0; k < 3; k++) {
      assertTrue(slept.get(k) >= 0 && slept.get(k) <= 0.5 * Math.pow(2, k));
    }
  }

  @Test
  public void anAttestedEnrollmentTakesANewNonceForEveryAttempt() throws Exception {
    String n1 = "0123456789abcdef0123456789abcdef";
    String n2 = "fedcba9876543210fedcba9876543210";
    Scripted http = new Scripted()
        .then(201, "{\"nonce\":\"" + n1 + "\",\"expires_in\":300}")
        .then(503, "{\"code\":\"server_busy\",\"message\":\"busy\"}", "Retry-After", "1")
        .then(201, "{\"nonce\":\"" + n2 + "\",\"expires_in\":300}")
        .then(201, "{\"device_id\":\"d-1\",\"token\":\"t\"}");
    String[] ids = client(http).enroll("key", "android", nonce -> "integrity-token-for-" + nonce);
    assertEquals("d-1", ids[0]);
    assertEquals(4, http.calls.size());
    assertTrue(http.calls.get(0).startsWith("POST http://server" + Protocol.Path.CHALLENGE));
    assertTrue(http.calls.get(1).startsWith("POST http://server" + Protocol.Path.DEVICES + " "));
    assertTrue(http.bodies.get(0).contains("\"enrollment_key\":\"key\""));
    JsonFields first = JsonFields.parse(http.bodies.get(1), "first enrollment");
    JsonFields second = JsonFields.parse(http.bodies.get(3), "second enrollment");
    assertEquals(n1, first.string(Protocol.Body.EnrollmentRequest.NONCE));
    assertEquals("integrity-token-for-" + n1, first.string(Protocol.Body.EnrollmentRequest.ATTESTATION));
    assertEquals(n2, second.string(Protocol.Body.EnrollmentRequest.NONCE));
    assertEquals("integrity-token-for-" + n2, second.string(Protocol.Body.EnrollmentRequest.ATTESTATION));
    assertEquals(1, slept.size()); // backed off once, between the attempts
  }

  @Test
  public void anAttestationRefusalIsNotRetried() {
    Scripted http = new Scripted()
        .then(201, "{\"nonce\":\"0123456789abcdef0123456789abcdef\",\"expires_in\":300}")
        .then(403, "{\"code\":\"attestation_failed\",\"message\":\"attestation refused: emulator\"}");
    ProtocolException ex = assertThrows(ProtocolException.class,
        () -> client(http).enroll("key", "android", nonce -> "emulator"));
    assertEquals(403, ex.status);
    assertEquals(Protocol.ErrorCode.ATTESTATION_FAILED, ex.code);
    assertEquals(2, http.calls.size());
  }

  @Test
  public void givesUpAfterTheLastAttemptAsTransient() {
    Scripted http = new Scripted().thenRefused().thenRefused().thenRefused().thenRefused();
    assertThrows(ProtocolException.Transient.class, () -> client(http).task());
    assertEquals(4, http.calls.size());
  }

  @Test
  public void noTaskWaitsRetryAfterAndGoneEndsTheRun() throws Exception {
    Scripted http = new Scripted().then(204, "", "Retry-After", "7")
        .then(410, "{\"code\":\"run_finished\",\"message\":\"done\"}");
    ProtocolClient c = client(http);
    ProtocolClient.TaskOrWait wait = c.task();
    assertNull(wait.task);
    assertEquals(7.0, wait.retryAfterSeconds, 0);
    assertThrows(ProtocolException.RunFinished.class, c::task);
  }

  @Test
  public void duplicateUpdateIsDoneAndOtherRefusalsCarryTheCode() throws Exception {
    Scripted http = new Scripted()
        .then(409, "{\"code\":\"duplicate_update\",\"message\":\"already\"}")
        .then(422, "{\"code\":\"personal_tensor_in_upload\",\"message\":\"classifier.weight\"}")
        .then(304, "")
        .then(200, "abc", "ETag", "\"e1\"");
    ProtocolClient c = client(http);
    assertEquals(-1, c.upload(1, new byte[8]));
    ProtocolException ex = assertThrows(ProtocolException.class, () -> c.upload(1, new byte[8]));
    assertEquals("personal_tensor_in_upload", ex.code);
    assertNull(c.download("/v1/models/1/base", "\"e0\"").body);
    assertTrue(http.calls.get(2).endsWith("\"e0\""));
    assertThrows(ProtocolException.class, () -> c.downloadVerified("/v1/artifacts/x", "0".repeat(64)));
  }

  @Test
  public void anUploadStillArrivingFromAnEarlierAttemptIsTransient() {
    // Revision 1.4: a device whose connection dropped mid-upload and that sends again while the
    // server still receives the first attempt gets 409 upload_in_progress: not a refusal.
    Scripted http = new Scripted().then(409, "{\"code\":\"upload_in_progress\",\"message\":\"wait\"}");
    assertThrows(ProtocolException.Transient.class, () -> client(http).upload(1, new byte[8]));
  }

  @Test
  public void aSecureDeviceSaysItCanTakePartInRevision17() throws Exception {
    Scripted http = new Scripted().then(204, "", "Retry-After", "1");
    client(http).task(true);
    assertEquals("secagg-1.7", http.headers.get(0).get(Protocol.Header.CAPABILITIES));
    assertEquals(Protocol.Header.SECAGG, http.headers.get(0).get(Protocol.Header.CAPABILITIES));
  }

  @Test
  public void aSecureStageNotBegunIsSentAgainAfterRetryAfterWithItsHeaders() throws Exception {
    // Revision 1.7: a device ahead of its cohort posts before the stage begins: 409
    // secagg_stage_not_open with Retry-After, and the same message again then.
    Scripted http = new Scripted()
        .then(409, "{\"code\":\"secagg_stage_not_open\",\"message\":\"not yet\"}", "Retry-After", "3")
        .then(409, "{\"code\":\"secagg_stage_not_open\",\"message\":\"not yet\"}", "Retry-After", "2")
        .then(202, "{\"round\":4,\"stage\":\"masked\"}")
        .then(409, "{\"code\":\"secagg_stage_closed\",\"message\":\"over\"}");
    ProtocolClient c = client(http);
    Map<String, String> unopened = Map.of(Protocol.Header.SECAGG_UNOPENED, "d-2,d-7");
    c.secaggSend(Protocol.Path.SECAGG_MASKED, 4, new byte[8], false, unopened);
    assertEquals(List.of(3.0, 2.0), slept);
    assertEquals(3, http.calls.size());
    for (int k = 0; k < 3; k++) {
      assertTrue(http.calls.get(k), http.calls.get(k).startsWith("POST http://server/v1/rounds/4/secagg/masked"));
      assertEquals("d-2,d-7", http.headers.get(k).get(Protocol.Header.SECAGG_UNOPENED));
      assertEquals(Protocol.Header.OCTET_STREAM, http.headers.get(k).get(Protocol.Header.CONTENT_TYPE));
    }
    ProtocolException closed = assertThrows(ProtocolException.class,
        () -> c.secaggSend(Protocol.Path.SECAGG_UNMASK, 4, new byte[2], true));
    assertEquals(Protocol.ErrorCode.SECAGG_STAGE_CLOSED, closed.code);
    assertNull(http.headers.get(3).get(Protocol.Header.SECAGG_UNOPENED));
  }
}
