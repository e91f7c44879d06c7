package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.After;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The phone's rules for a round, each against a real `fedper serve`: WorkManager's stop signal
 * (simulated: the flag RoundWorker reads from isStopped()) ends the round with nothing uploaded
 * and the head uncommitted; loading the program, the photos and evaluating count against the
 * round's budget; a secure round commits the head only once the unmasking is done.
 */
public class RoundRulesTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private TestServer server;

  @After public void stop() throws Exception {
    if (server != null) {
      server.stop();
      server = null;
    }
  }

  /** A phone's loop on its own store, with a budget the test controls. */
  final class Phone {
    final RoundLoopIntegrationTest.RecordingTransport http;
    final RoundLoopIntegrationTest.FakeTrainer trainer = new RoundLoopIntegrationTest.FakeTrainer(1f);
    final DeviceStore store;
    final RoundLoop loop;

    Phone(DeviceStore store, RoundBudget budget, RoundLoopIntegrationTest.RecordingTransport http,
        RoundLoop.TrainerFactory factory) {
      this.store = store;
      this.http = http;
      ProtocolClient client = new ProtocolClient(server.url, http, Backoff.standard(), new Random(0), budget);
      this.loop = new RoundLoop(client, store, m -> RoundLoopIntegrationTest.data(10),
          factory != null ? factory : (dir, m) -> trainer, budget, 0.5, 0);
    }

    List<RoundLoop.Report> run() throws Exception {
      loop.ensureEnrolled(TestServer.ENROLL, "android-rules-test");
      return loop.run(0);
    }
  }

  private static String sha(String export) throws Exception {
    return ProtocolClient.sha256Hex(Files.readAllBytes(HostFixtures.dir().resolve(export).resolve("manifest.json")));
  }

  private static Map<String, Tensor> initialHead() throws Exception {
    Manifest m = Manifest.parse(new String(Files.readAllBytes(HostFixtures.dir().resolve("artifacts/manifest.json")),
        java.nio.charset.StandardCharsets.UTF_8));
    return Manifest.readChecked(HostFixtures.dir().resolve("artifacts").resolve(m.artifacts.get("initial_head")), m.head);
  }

  @Test public void aRoundStoppedByTheSchedulerUploadsNothingAndCommitsNoHead() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 1);
    DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
    AtomicBoolean stopped = new AtomicBoolean();
    RoundBudget budget = RoundBudget.unlimited(Backoff.Sleeper.REAL);
    budget.stopWhen(stopped::get);
    Phone phone = new Phone(store, budget, new RoundLoopIntegrationTest.RecordingTransport(), null);
    // WorkManager stops the worker mid-training (the phone was unplugged during the batch).
    phone.trainer.beforeStep = done -> stopped.set(true);
    ProtocolException.Stopped e = assertThrows(ProtocolException.Stopped.class, phone::run);
    assertTrue(e.getMessage(), e.getMessage().contains("before evaluation after training"));
    assertEquals(1, phone.trainer.steps);
    assertTrue(phone.http.uploads.isEmpty());
    assertNull(store.heads.load(sha("artifacts"))); // nothing committed

    // WorkManager runs it again once the constraints hold: the round trains from the exported head.
    stopped.set(false);
    Phone again = new Phone(store, RoundBudget.unlimited(Backoff.Sleeper.REAL),
        new RoundLoopIntegrationTest.RecordingTransport(), null);
    assertEquals(1, again.run().size());
    assertEquals(1, again.http.uploads.size());
    assertEquals(initialHead(), again.trainer.headsReceived.get(0));
    assertEquals(RoundLoopIntegrationTest.shifted(initialHead(), 1f), store.heads.load(sha("artifacts")));
  }

  @Test public void aStopEndsTheRoundBeforeItsNextRequest() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 1);
    RoundBudget budget = RoundBudget.unlimited(Backoff.Sleeper.REAL);
    AtomicLong requests = new AtomicLong();
    RoundLoopIntegrationTest.RecordingTransport http = new RoundLoopIntegrationTest.RecordingTransport() {
      @Override public Response send(String method, String url, Map<String, String> headers, byte[] body)
          throws java.io.IOException {
        requests.incrementAndGet();
        return super.send(method, url, headers, body);
      }
    };
    budget.stopWhen(() -> requests.get() >= 3);
    Phone phone = new Phone(new DeviceStore(tmp.newFolder().toPath()), budget, http, null);
    ProtocolException.Stopped e = assertThrows(ProtocolException.Stopped.class, phone::run);
    assertEquals(3, requests.get()); // no request after the signal
    assertTrue(phone.http.uploads.isEmpty());
    assertFalse(e.getMessage().isEmpty());
  }

  @Test public void loadingTheProgramAndThePhotosAndEvaluatingCountAgainstTheBudget() throws Exception {
    // Each phase in turn takes the whole 8 minutes on the test's clock; the round stops before the next.
    String[] slowPhase = {"trainer", "photos", "evaluation"};
    String[] stoppedBefore = {"GET /v1/models/0/base", "evaluation", "training"};
    for (int k = 0; k < slowPhase.length; k++) {
      String phase = slowPhase[k];
      stop(); // a fresh server: the slot the last phone holds would keep this one waiting
      server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 1);
      AtomicLong now = new AtomicLong();
      Runnable spend = () -> now.addAndGet(481_000_000_000L);
      RoundBudget budget = new RoundBudget(480, now::get, Backoff.Sleeper.REAL);
      RoundLoopIntegrationTest.FakeTrainer trainer = new RoundLoopIntegrationTest.FakeTrainer(1f) {
        @Override public double evaluate(LocalData.Batch batch) {
          if (phase.equals("evaluation")) {
            spend.run();
          }
          return super.evaluate(batch);
        }
      };
      DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
      ProtocolClient client = new ProtocolClient(server.url, new RoundLoopIntegrationTest.RecordingTransport(),
          Backoff.standard(), new Random(0), budget);
      RoundLoop loop = new RoundLoop(client, store, m -> {
        if (phase.equals("photos")) {
          spend.run();
        }
        return RoundLoopIntegrationTest.data(10);
      }, (dir, m) -> {
        if (phase.equals("trainer")) {
          spend.run();
        }
        return trainer;
      }, budget, 0.5, 0);
      loop.ensureEnrolled(TestServer.ENROLL, "android-rules-test");
      ProtocolException.OutOfTime e = assertThrows(phase, ProtocolException.OutOfTime.class, () -> loop.run(0));
      assertTrue(phase + ": " + e.getMessage(), e.getMessage().contains("budget is spent before " + stoppedBefore[k]));
      assertEquals(phase, 0, trainer.steps);
    }
  }

  @Test public void aSecureRoundCommitsTheHeadOnlyOnceTheUnmaskingIsDone() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 3, "--round-timeout", "60", "--secagg",
        "--checkin-window", "2", "--cohort-size", "3", "--over-selection", "1", "--secagg-stage-timeout", "10",
        "--start-devices", "3");
    String sha = sha("artifacts");
    List<Phone> phones = new ArrayList<>();
    List<String> committedAtUnmask = Collections.synchronizedList(new ArrayList<>());
    RoundLoopIntegrationTest.DeviceRun[] runs = new RoundLoopIntegrationTest.DeviceRun[3];
    for (int d = 0; d < 3; d++) {
      DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
      RoundLoopIntegrationTest.RecordingTransport http = new RoundLoopIntegrationTest.RecordingTransport() {
        @Override public Response send(String method, String url, Map<String, String> headers, byte[] body)
            throws java.io.IOException {
          if (method.equals("POST") && url.endsWith("/secagg/unmask")) {
            committedAtUnmask.add(store.heads.load(sha) == null ? "uncommitted" : "committed");
          }
          return super.send(method, url, headers, body);
        }
      };
      Phone p = new Phone(store, RoundBudget.unlimited(Backoff.Sleeper.REAL), http, null);
      phones.add(p);
      runs[d] = () -> assertEquals(1, p.run().size());
    }
    RoundLoopIntegrationTest.runConcurrently(runs);
    assertEquals(List.of("uncommitted", "uncommitted", "uncommitted"), committedAtUnmask);
    for (Phone p : phones) {
      assertEquals(RoundLoopIntegrationTest.shifted(initialHead(), 1f), p.store.heads.load(sha));
    }
  }
}
