package org.fedper.core;

import static org.fedper.core.RoundLoopIntegrationTest.data;
import static org.fedper.core.RoundLoopIntegrationTest.shifted;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.fedper.core.RoundLoopIntegrationTest.Device;
import org.fedper.core.RoundLoopIntegrationTest.FakeTrainer;
import org.junit.After;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * What RoundLoop does with each PROTOCOL.md outcome other than a plain 202, against a real
 * `fedper serve`: a refused upload never trains the head twice; 410 on an upload ends the run;
 * not_in_cohort waits Retry-After; 401 re-enrolls once; a manifest is pinned only once its
 * trainer loaded.
 */
public class RoundOutcomesTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private TestServer server;

  private TestServer start(String export, int rounds, int clients, String... extra) throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), export, rounds, clients, extra);
    return server;
  }

  @After
  public void stop() throws Exception {
    if (server != null) {
      server.stop();
    }
  }

  private static Map<String, Tensor> initialHead() throws Exception {
    Path dir = HostFixtures.dir().resolve("artifacts");
    Manifest m = Manifest.parse(new String(Files.readAllBytes(dir.resolve("manifest.json")), java.nio.charset.StandardCharsets.UTF_8));
    return Safetensors.read(Files.readAllBytes(dir.resolve(m.artifacts.get("initial_head")))).tensors;
  }

  private static String sha() throws Exception {
    return ProtocolClient.sha256Hex(Files.readAllBytes(HostFixtures.dir().resolve("artifacts/manifest.json")));
  }

  @Test
  public void anUploadRefusedAsNotInCohortWaitsRetryAfterAndRetrainsFromTheCommittedHead() throws Exception {
    // Slots expire 3 s after they are given; the first training takes 4 s, so its upload finds
    // the slot gone (409 not_in_cohort). The device waits Retry-After, gets the round again and
    // trains it again from the head it had before: the refused round's head was never committed.
    TestServer s = start("artifacts", 1, 1, "--report-timeout", "3");
    FakeTrainer trainer = new FakeTrainer(1f);
    trainer.beforeStep = done -> {
      if (trainer.headsReceived.size() == 1) {
        Thread.sleep(4000);
      }
    };
    Device device = new Device(s.url, new DeviceStore(tmp.newFolder().toPath()), trainer, data(10), 30);
    List<RoundLoop.Report> reports = device.runUntilFinished();
    assertEquals(1, reports.size());
    assertEquals(2, device.http.uploadAnswers.size());
    HttpTransport.Response refused = device.http.uploadAnswers.get(0);
    assertEquals(s.log(), 409, refused.status);
    assertTrue(new String(refused.body, java.nio.charset.StandardCharsets.UTF_8).contains("not_in_cohort"));
    double retryAfter = Double.parseDouble(refused.header("Retry-After"));
    assertTrue(device.slept.toString(), device.slept.contains(Math.min(retryAfter, 30)));
    assertEquals(202, device.http.uploadAnswers.get(1).status);
    // Both attempts started from the exported head; the store holds it trained once.
    assertEquals(2, trainer.headsReceived.size());
    assertEquals(initialHead(), trainer.headsReceived.get(0));
    assertEquals(initialHead(), trainer.headsReceived.get(1));
    assertEquals(shifted(initialHead(), 1f), device.store.heads.load(sha()));
  }

  @Test
  public void gone410OnTheUploadEndsTheRunAndCommitsNothing() throws Exception {
    TestServer s = start("artifacts", 3, 1);
    FakeTrainer trainer = new FakeTrainer(1f);
    trainer.beforeStep = done -> assertEquals(200, s.admin("POST", "/v1/admin/stop").status);
    Device device = new Device(s.url, new DeviceStore(tmp.newFolder().toPath()), trainer, data(10), 0.5);
    List<RoundLoop.Report> reports = device.runUntilFinished(); // returns: not "round failed"
    assertTrue(reports.isEmpty());
    assertTrue(device.loop.finished());
    assertEquals(410, device.http.uploadAnswers.get(0).status);
    assertNull(device.store.heads.load(sha())); // that round was not aggregated: its head is not kept
  }

  @Test
  public void a401ReenrollsOnceWithTheKeyAndEndsWithoutOne() throws Exception {
    TestServer s = start("artifacts", 1, 1);
    DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
    Device device = new Device(s.url, store, new FakeTrainer(1f), data(10), 0.5);
    String first = device.loop.ensureEnrolled(TestServer.ENROLL, "android-host-test");
    assertEquals(200, s.admin("POST", "/v1/admin/devices/" + first + "/revoke").status);
    assertEquals(1, device.loop.run(0).size()); // 401 on the task, enrolled again, finished the round
    assertNotEquals(first, device.loop.deviceId());
    assertEquals(device.loop.deviceId(), store.credentials()[0]);

    // Revoked again, and this app holds no enrollment key: it says so and stops.
    Device keyless = new Device(s.url, store, new FakeTrainer(1f), data(10), 0.5);
    String second = keyless.loop.ensureEnrolled(null, "android-host-test"); // the stored token
    assertEquals(device.loop.deviceId(), second);
    assertEquals(200, s.admin("POST", "/v1/admin/devices/" + second + "/revoke").status);
    ProtocolException.Unauthorized ex = assertThrows(ProtocolException.Unauthorized.class, () -> keyless.loop.run(0));
    assertTrue(ex.getMessage(), ex.getMessage().contains("no longer enrolled"));
  }

  @Test
  public void aManifestIsPinnedOnlyOnceItsTrainerLoaded() throws Exception {
    TestServer s = start("artifacts", 1, 1);
    DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
    Device device = new Device(s.url, store, new FakeTrainer(1f), data(10), 0.5);
    IllegalArgumentException cannotLoad = new IllegalArgumentException("this runtime cannot load the programs");
    device.loadFailure = cannotLoad;
    assertSame(cannotLoad, assertThrows(IllegalArgumentException.class, device::runUntilFinished));
    assertNull(store.pinnedManifest());
    assertFalse(device.http.uploads.size() > 0);
    device.loadFailure = null; // e.g. the app was updated
    assertEquals(1, device.loop.run(0).size());
    assertEquals(sha(), store.pinnedManifest());
  }
}
