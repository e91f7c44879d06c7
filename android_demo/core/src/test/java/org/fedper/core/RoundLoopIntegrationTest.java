package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.After;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The Java client against a real `fedper serve` process: two devices and two full rounds; a
 * device with an empty test split; a head-only export; a device whose server moved to another
 * export (a new model, or one whose base would take tensors the device keeps personal).
 */
public class RoundLoopIntegrationTest {
  private static final String ENROLL = TestServer.ENROLL;

  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private TestServer server;
  private String url;

  /** Starts `fedper serve` on fixtures export NAME (a new data dir each time), stopping the last one. */
  private void startServer(String export, int rounds, int clients) throws Exception {
    stopServer();
    server = new TestServer(tmp.getRoot().toPath(), export, rounds, clients);
    url = server.url;
  }

  @After
  public void stopServer() throws Exception {
    if (server != null) {
      server.stop();
      server = null;
    }
  }

  /** Returns the received base plus a known offset, and the received head plus one. */
  static class FakeTrainer implements Trainer {
    final float offset;
    final List<Map<String, Tensor>> headsReceived = new ArrayList<>();
    Map<String, Tensor> base;
    Map<String, Tensor> head;
    int steps;
    /** Runs before each step (argument: steps done so far): a test's way to act mid-training. */
    Step beforeStep = done -> {};

    interface Step {
      void run(int done) throws Exception;
    }

    FakeTrainer(float offset) {
      this.offset = offset;
    }

    @Override public void setBase(Map<String, Tensor> b) {
      base = b;
    }

    @Override public void setHead(Map<String, Tensor> h) {
      head = h;
      headsReceived.add(h);
    }

    @Override public void startRound(TrainConfig config) {}

    @Override public float trainStep(LocalData.Batch batch) throws Exception {
      beforeStep.run(steps);
      assertTrue("batches of at least 2", batch.size() >= 2);
      steps++;
      return 1.0f;
    }

    @Override public Map<String, Tensor> getBase() {
      return shifted(base, offset);
    }

    @Override public Map<String, Tensor> getHead() {
      return shifted(head, 1f);
    }

    @Override public double evaluate(LocalData.Batch batch) {
      assertTrue("evaluated on an empty test split", batch.size() > 0);
      return 0.5;
    }
  }

  static Map<String, Tensor> shifted(Map<String, Tensor> tensors, float by) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    tensors.forEach((n, t) -> out.put(n, t.plus(by)));
    return out;
  }

  static LocalData data(int n) {
    return data(n, 4);
  }

  static LocalData data(int n, int testSize) {
    return new LocalData() {
      @Override public int trainSize() {
        return n;
      }

      @Override public Batch trainBatch(int[] idx) {
        return new Batch(new float[idx.length * 3 * 32 * 32], new long[idx.length]);
      }

      @Override public Batch testSet() {
        return new Batch(new float[testSize * 3 * 32 * 32], new long[testSize]);
      }
    };
  }

  interface DeviceRun {
    void run() throws Exception;
  }

  /** Runs each device on its own thread (as phones would), fails the test with every error. */
  static void runConcurrently(DeviceRun... runs) throws InterruptedException {
    List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
    List<Thread> threads = new ArrayList<>();
    for (DeviceRun run : runs) {
      Thread t = new Thread(() -> {
        try {
          run.run();
        } catch (Throwable e) {
          errors.add(e);
        }
      });
      t.start();
      threads.add(t);
    }
    for (Thread t : threads) {
      t.join(120_000);
    }
    assertTrue("device errors: " + errors, errors.isEmpty());
  }

  @Test
  public void twoDevicesTwoRoundsAndTheAggregateIsTheWeightedMean() throws Exception {
    startServer("artifacts", 2, 2);
    int[] samples = {30, 10};
    // Within 3x of each other: the server's robust defaults (protocol revision 1.3) clip an update
    // farther than 3x the round's lower median distance, and these two are aggregated as they came.
    float[] offsets = {1f, 2.5f};
    FakeTrainer[] trainers = new FakeTrainer[2];
    DeviceStore[] stores = new DeviceStore[2];
    List<List<RoundLoop.Report>> reports = Collections.synchronizedList(new ArrayList<>());
    DeviceRun[] runs = new DeviceRun[2];
    for (int d = 0; d < 2; d++) {
      final int dev = d;
      trainers[d] = new FakeTrainer(offsets[d]);
      stores[d] = new DeviceStore(tmp.getRoot().toPath().resolve("device" + d));
      RoundBudget budget = RoundBudget.unlimited(Backoff.Sleeper.REAL);
      ProtocolClient client = new ProtocolClient(url, new HttpTransport.UrlConnection(30_000), Backoff.standard(),
          new Random(d), budget);
      RoundLoop loop = new RoundLoop(client, stores[d], m -> data(samples[dev]), (dir, m) -> trainers[dev],
          budget, 0.5, d);
      runs[d] = () -> {
        loop.ensureEnrolled(ENROLL, "android-host-test");
        reports.add(loop.run(0)); // until 410
      };
    }
    runConcurrently(runs);
    assertEquals(2, reports.size());
    for (List<RoundLoop.Report> r : reports) {
      assertEquals(2, r.size());
    }

    Path artifacts = HostFixtures.dir().resolve("artifacts");
    Manifest manifest = Manifest.parse(new String(Files.readAllBytes(artifacts.resolve("manifest.json")), StandardCharsets.UTF_8));
    Map<String, Tensor> initialBase = Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_base")))).tensors;
    Map<String, Tensor> initialHead = Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_head")))).tensors;

    // Each round the server averages base + offset with weights 30:10, so two rounds add
    // 2 * (30 * 1 + 10 * 2.5) / 40 = 2.75 to every element of the initial base.
    HttpTransport.Response latest = server.admin("GET", "/v1/admin/models/latest/base");
    assertEquals(200, latest.status);
    Map<String, Tensor> result = Safetensors.read(latest.body).tensors;
    assertEquals(manifest.base.keySet(), result.keySet());
    for (String name : manifest.baseNames()) {
      float[] got = result.get(name).data();
      float[] init = initialBase.get(name).data();
      for (int k = 0; k < got.length; k++) {
        assertEquals(name, init[k] + 2.75f, got[k], 1e-5f * Math.max(1f, Math.abs(init[k])));
      }
    }
    for (int d = 0; d < 2; d++) {
      // Round 1 started from the exported head, round 2 from the head it kept in its store.
      assertEquals(initialHead, trainers[d].headsReceived.get(0));
      assertEquals(shifted(initialHead, 1f), trainers[d].headsReceived.get(1));
      assertEquals(shifted(shifted(initialHead, 1f), 1f), stores[d].heads.load(manifest_sha(artifacts)));
      assertNotNull(stores[d].credentials());
      // 30 examples at batch 32: one step per epoch; 10 examples: one step.
      assertEquals(2, trainers[d].steps);
    }
    assertArrayEquals(new long[] {1, 2}, new long[] {reports.get(0).get(0).round, reports.get(0).get(1).round});
  }

  /** The real transport, keeping every upload's body (what the server was sent) and answer. */
  static class RecordingTransport implements HttpTransport {
    final HttpTransport real = new HttpTransport.UrlConnection(30_000);
    final List<Safetensors.File> uploads = Collections.synchronizedList(new ArrayList<>());
    final List<Response> uploadAnswers = Collections.synchronizedList(new ArrayList<>());

    @Override
    public Response send(String method, String url, Map<String, String> headers, byte[] body) throws java.io.IOException {
      Response r = real.send(method, url, headers, body);
      if (method.equals("POST") && url.endsWith("/updates")) {
        uploads.add(Safetensors.read(body));
        uploadAnswers.add(r);
      }
      return r;
    }
  }

  /** One device on one store: its loop, what it uploaded, its waits and the manifests it loaded. */
  static final class Device {
    final DeviceStore store;
    final RecordingTransport http = new RecordingTransport();
    final List<Manifest> manifests = new ArrayList<>();
    final List<Double> slept = Collections.synchronizedList(new ArrayList<>());
    final FakeTrainer trainer;
    final RoundLoop loop;
    /** Thrown by the trainer factory instead of returning the trainer (a runtime that cannot load). */
    RuntimeException loadFailure;

    Device(String url, DeviceStore store, float offset, LocalData data) {
      this(url, store, new FakeTrainer(offset), data, 0.5);
    }

    Device(String url, DeviceStore store, FakeTrainer trainer, LocalData data, double maxIdleWait) {
      this.store = store;
      this.trainer = trainer;
      RoundBudget budget = RoundBudget.unlimited(seconds -> {
        slept.add(seconds);
        Backoff.Sleeper.REAL.sleep(seconds);
      });
      ProtocolClient client = new ProtocolClient(url, http, Backoff.standard(), new Random(0), budget);
      this.loop = new RoundLoop(client, store, m -> data, (dir, m) -> {
        if (loadFailure != null) {
          throw loadFailure;
        }
        manifests.add(m);
        return trainer;
      }, budget, maxIdleWait, 0);
    }

    List<RoundLoop.Report> runUntilFinished() throws Exception {
      loop.ensureEnrolled(ENROLL, "android-host-test");
      return loop.run(0);
    }
  }

  private static Map<String, Tensor> initial(String export, String role) throws Exception {
    Path dir = HostFixtures.dir().resolve(export);
    return Safetensors.read(Files.readAllBytes(dir.resolve(manifest(export).artifacts.get(role)))).tensors;
  }

  private static Manifest manifest(String export) throws Exception {
    Path file = HostFixtures.dir().resolve(export).resolve("manifest.json");
    return Manifest.parse(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
  }

  @Test
  public void aDpServersDeviceClipsItsDeltaAndTheServerAcceptsIt() throws Exception {
    stopServer();
    // Revision 1.5: a check-in window, then a task carrying dp.clip_norm; the round closes at its deadline.
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 1, "--round-timeout", "8", "--dp",
        "--checkin-window", "1", "--cohort-size", "1", "--dp-clip", "0.5", "--dp-clip-learning-rate", "0",
        "--dp-noise-multiplier", "0.5", "--dp-delta", "1e-5");
    url = server.url;
    Device device = new Device(url, new DeviceStore(tmp.newFolder().toPath()), 1f, data(10));
    List<RoundLoop.Report> reports = device.runUntilFinished();
    assertEquals(1, reports.size());
    assertEquals(1, reports.get(0).received); // accepted: the server measured it within the clip
    assertEquals(1, device.http.uploads.size());
    Map<String, String> meta = device.http.uploads.get(0).metadata;
    assertEquals("0", meta.get(Protocol.Metadata.UNCLIPPED)); // base + 1 everywhere: far beyond 0.5
    Map<String, Tensor> received = initial("artifacts", "initial_base");
    double norm = DeltaClipping.distance(device.http.uploads.get(0).tensors, received, manifest("artifacts").baseNames());
    assertTrue("delta norm " + norm, norm <= 0.5 && norm > 0.49);
  }

  @Test
  public void threeAppsTakePartInASecureRoundAndItsBaseIsTheirWeightedMean() throws Exception {
    stopServer();
    // Revision 1.7 (docs/SECAGG.md): the host JVM has X25519, so the round loop says it can
    // (secagg-1.7), keeps its keys and shares before it trains, sends its delta masked and answers
    // the unmasking; the server puts the three together only if every byte is as it expects.
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 3, "--round-timeout", "60", "--secagg",
        "--checkin-window", "2", "--cohort-size", "3", "--over-selection", "1", "--secagg-stage-timeout", "10",
        "--start-devices", "3");
    url = server.url;
    int[] samples = {30, 10, 20};
    float[] offsets = {1e-4f, 2e-4f, 4e-4f}; // deltas well within the clip (norm about 0.05 to 0.2)
    Device[] devices = new Device[3];
    DeviceRun[] runs = new DeviceRun[3];
    for (int d = 0; d < 3; d++) {
      devices[d] = new Device(url, new DeviceStore(tmp.newFolder().toPath()), offsets[d], data(samples[d]));
      runs[d] = devices[d]::runUntilFinished;
    }
    runConcurrently(runs);
    for (Device d : devices) {
      assertEquals(0, d.http.uploads.size()); // nothing went to /updates: only masked words
    }
    Map<String, Tensor> initial = initial("artifacts", "initial_base");
    HttpTransport.Response latest = server.admin("GET", "/v1/admin/models/latest/base");
    Map<String, Tensor> result = Safetensors.read(latest.body).tensors;
    double mean = (30 * 1e-4 + 10 * 2e-4 + 20 * 4e-4) / 60; // sample-weighted FedAvg of the offsets
    for (String name : manifest("artifacts").baseNames()) {
      float[] got = result.get(name).data();
      float[] init = initial.get(name).data();
      for (int k = 0; k < got.length; k++) {
        assertEquals(name, init[k] + mean, got[k], 1e-6 + Math.ulp(init[k]));
      }
    }
  }

  @Test
  public void aSecureServerRefusesADeviceWithoutX25519WithAClearError() throws Exception {
    stopServer();
    server = new TestServer(tmp.getRoot().toPath(), "artifacts", 1, 1, "--round-timeout", "100", "--secagg",
        "--checkin-window", "1", "--cohort-size", "1", "--over-selection", "1");
    RoundBudget budget = RoundBudget.unlimited(Backoff.Sleeper.REAL);
    ProtocolClient client = new ProtocolClient(server.url, budget);
    client.enroll(ENROLL, "android-api-28");
    ProtocolException refused = assertThrows(ProtocolException.class, () -> client.task(false));
    assertEquals(403, refused.status);
    assertEquals(Protocol.ErrorCode.SECAGG_UNSUPPORTED, refused.code);
    assertTrue(refused.getMessage(), refused.getMessage().contains(Protocol.Header.SECAGG)); // what it must say
  }

  @Test
  public void aDeviceWithAnEmptyTestSplitCompletesItsRoundWithoutAnAccuracy() throws Exception {
    startServer("artifacts", 1, 1);
    Device device = new Device(url, new DeviceStore(tmp.newFolder().toPath()), 1f, data(10, 0));
    List<RoundLoop.Report> reports = device.runUntilFinished(); // FakeTrainer fails on an empty evaluate
    assertEquals(1, reports.size());
    assertEquals(1, reports.get(0).received); // the server accepted the upload
    assertTrue(Double.isNaN(reports.get(0).accuracy));
    assertEquals(1, device.http.uploads.size());
    Map<String, String> meta = device.http.uploads.get(0).metadata;
    assertFalse(meta.toString(), meta.containsKey("metric.accuracy"));
    assertFalse(meta.toString(), meta.containsKey("metric.accuracy_after"));
    assertEquals("1.0", meta.get("metric.train_loss"));
    assertEquals("10", meta.get("num_samples"));
  }

  @Test
  public void headOnlyTrainingUploadsTheReceivedBaseAndKeepsAChangedHead() throws Exception {
    startServer("artifacts-head", 1, 1);
    Manifest m = manifest("artifacts-head");
    assertEquals("head", m.trainable);
    Device device = new Device(url, new DeviceStore(tmp.newFolder().toPath()), 2f, data(10));
    assertEquals(1, device.runUntilFinished().size());
    assertEquals(1, device.http.uploads.size());
    Map<String, Tensor> uploaded = device.http.uploads.get(0).tensors;
    assertEquals(m.baseNames(), new ArrayList<>(uploaded.keySet()));
    assertEquals(initial("artifacts-head", "initial_base"), uploaded); // the trainer's base + 2 is not sent
    String sha = ProtocolClient.sha256Hex(Files.readAllBytes(HostFixtures.dir().resolve("artifacts-head/manifest.json")));
    assertEquals(shifted(initial("artifacts-head", "initial_head"), 1f), device.store.heads.load(sha));
  }

  @Test
  public void aNewExportIsANewModelAndOneThatWouldUploadAPersonalTensorIsRefused() throws Exception {
    DeviceStore store = new DeviceStore(tmp.newFolder().toPath());
    String shaA = ProtocolClient.sha256Hex(Files.readAllBytes(HostFixtures.dir().resolve("artifacts/manifest.json")));
    String shaB = ProtocolClient.sha256Hex(Files.readAllBytes(HostFixtures.dir().resolve("artifacts-seed1/manifest.json")));
    startServer("artifacts", 1, 1);
    Device first = new Device(url, store, 1f, data(10));
    assertEquals(1, first.runUntilFinished().size());
    assertEquals(shaA, store.pinnedManifest());
    Map<String, Tensor> headA = store.heads.load(shaA);
    assertEquals(shifted(initial("artifacts", "initial_head"), 1f), headA);

    // The server restarts on another model with the same partition; the device enrolls with it
    // anew (the old server's token means nothing there) and keeps its pinned manifest and heads.
    startServer("artifacts-seed1", 1, 1);
    Files.delete(store.root().resolve("device.json"));
    Device second = new Device(url, store, 1f, data(10));
    assertEquals(1, second.runUntilFinished().size());
    assertEquals(1, second.manifests.size());
    assertEquals(manifest("artifacts-seed1").baseNames(), second.manifests.get(0).baseNames());
    assertEquals(shaB, store.pinnedManifest());
    // A new model starts from its own exported head, not the head trained for the old one.
    assertEquals(initial("artifacts-seed1", "initial_head"), second.trainer.headsReceived.get(0));
    assertEquals(manifest("artifacts-seed1").baseNames(), new ArrayList<>(second.http.uploads.get(0).tensors.keySet()));
    assertEquals(headA, store.heads.load(shaA)); // the old model's head is kept

    // Then on an export whose base holds tensors the pinned manifest keeps personal: refused
    // before any training or upload, and the device stays pinned to the manifest it had.
    startServer("artifacts-kp1", 1, 1);
    Files.delete(store.root().resolve("device.json"));
    Device third = new Device(url, store, 1f, data(10));
    ProtocolException refused = assertThrows(ProtocolException.class, third::runUntilFinished);
    assertEquals("manifest_conflict", refused.code);
    assertTrue(refused.getMessage(), refused.getMessage().contains("blocks.12."));
    assertTrue(third.http.uploads.isEmpty());
    assertTrue(third.manifests.isEmpty());
    assertEquals(shaB, store.pinnedManifest());
  }

  private static String manifest_sha(Path artifacts) throws Exception {
    return ProtocolClient.sha256Hex(Files.readAllBytes(artifacts.resolve("manifest.json")));
  }
}
