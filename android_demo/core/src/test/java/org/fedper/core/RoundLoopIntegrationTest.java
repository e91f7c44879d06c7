package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
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
import org.junit.Before;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** The Java client against a real `fedper serve` process: two devices, two full rounds. */
public class RoundLoopIntegrationTest {
  private static final String ADMIN = "admin-token-for-java-tests-0123456789";
  private static final String ENROLL = "enrollment-key-for-java-tests";

  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private Process server;
  private String url;

  @Before
  public void startServer() throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    url = "http://127.0.0.1:" + port;
    ProcessBuilder pb = new ProcessBuilder(HostFixtures.python(), "-m", "fedper.cli", "serve",
        "--artifacts", HostFixtures.dir().resolve("artifacts").toString(),
        "--data-dir", tmp.getRoot().toPath().resolve("server").toString(), "--port", Integer.toString(port),
        "--rounds", "2", "--target-clients", "2", "--min-clients", "2", "--round-timeout", "0",
        "--retry-after", "1");
    pb.environment().put("FEDPER_ADMIN_TOKEN", ADMIN);
    pb.environment().put("FEDPER_ENROLLMENT_KEY", ENROLL);
    pb.redirectErrorStream(true).redirectOutput(new File(tmp.getRoot(), "server.log"));
    server = pb.start();
    HttpTransport http = new HttpTransport.UrlConnection(2000);
    for (int i = 0; i < 300; i++) {
      assertTrue("server exited: " + log(), server.isAlive());
      try {
        if (http.send("GET", url + "/v1/health", Collections.emptyMap(), null).status == 200) {
          return;
        }
      } catch (java.io.IOException notYet) {
        Thread.sleep(200);
      }
    }
    throw new AssertionError("server did not start: " + log());
  }

  @After
  public void stopServer() throws Exception {
    server.destroy();
    server.waitFor();
  }

  private String log() throws Exception {
    return new String(Files.readAllBytes(tmp.getRoot().toPath().resolve("server.log")), StandardCharsets.UTF_8);
  }

  /** Returns the received base plus a known offset, and the received head plus one. */
  static final class FakeTrainer implements Trainer {
    final float offset;
    final List<Map<String, Tensor>> headsReceived = new ArrayList<>();
    Map<String, Tensor> base;
    Map<String, Tensor> head;
    int steps;

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

    @Override public float trainStep(LocalData.Batch batch) {
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
      return 0.5;
    }
  }

  static Map<String, Tensor> shifted(Map<String, Tensor> tensors, float by) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    tensors.forEach((n, t) -> out.put(n, t.plus(by)));
    return out;
  }

  static LocalData data(int n) {
    return new LocalData() {
      @Override public int trainSize() {
        return n;
      }

      @Override public Batch trainBatch(int[] idx) {
        return new Batch(new float[idx.length * 3 * 32 * 32], new long[idx.length]);
      }

      @Override public Batch testSet() {
        return new Batch(new float[4 * 3 * 32 * 32], new long[4]);
      }
    };
  }

  @Test
  public void twoDevicesTwoRoundsAndTheAggregateIsTheWeightedMean() throws Exception {
    int[] samples = {30, 10};
    float[] offsets = {1f, 4f};
    FakeTrainer[] trainers = new FakeTrainer[2];
    DeviceStore[] stores = new DeviceStore[2];
    List<List<RoundLoop.Report>> reports = Collections.synchronizedList(new ArrayList<>());
    List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
    Thread[] threads = new Thread[2];
    for (int d = 0; d < 2; d++) {
      final int dev = d;
      trainers[d] = new FakeTrainer(offsets[d]);
      stores[d] = new DeviceStore(tmp.getRoot().toPath().resolve("device" + d));
      ProtocolClient client = new ProtocolClient(url, new HttpTransport.UrlConnection(30_000), Backoff.standard(),
          new Random(d), Backoff.Sleeper.REAL);
      RoundLoop loop = new RoundLoop(client, stores[d], m -> data(samples[dev]), (dir, m) -> trainers[dev],
          Backoff.Sleeper.REAL, 0.5, d);
      threads[d] = new Thread(() -> {
        try {
          loop.ensureEnrolled(ENROLL, "android-host-test");
          reports.add(loop.run(0)); // until 410
        } catch (Throwable t) {
          errors.add(t);
        }
      });
      threads[d].start();
    }
    for (Thread t : threads) {
      t.join(120_000);
    }
    assertTrue("device errors: " + errors, errors.isEmpty());
    assertEquals(2, reports.size());
    for (List<RoundLoop.Report> r : reports) {
      assertEquals(2, r.size());
    }

    Path artifacts = HostFixtures.dir().resolve("artifacts");
    Manifest manifest = Manifest.parse(new String(Files.readAllBytes(artifacts.resolve("manifest.json")), StandardCharsets.UTF_8));
    Map<String, Tensor> initialBase = Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_base")))).tensors;
    Map<String, Tensor> initialHead = Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_head")))).tensors;

    // Each round the server averages base + offset with weights 30:10, so two rounds add
    // 2 * (30 * 1 + 10 * 4) / 40 = 3.5 to every element of the initial base.
    Map<String, String> admin = new LinkedHashMap<>();
    admin.put("Authorization", "Bearer " + ADMIN);
    HttpTransport.Response latest = new HttpTransport.UrlConnection(30_000)
        .send("GET", url + "/v1/admin/models/latest/base", admin, null);
    assertEquals(200, latest.status);
    Map<String, Tensor> result = Safetensors.read(latest.body).tensors;
    assertEquals(manifest.base.keySet(), result.keySet());
    for (String name : manifest.baseNames()) {
      float[] got = result.get(name).data();
      float[] init = initialBase.get(name).data();
      for (int k = 0; k < got.length; k++) {
        assertEquals(name, init[k] + 3.5f, got[k], 1e-5f * Math.max(1f, Math.abs(init[k])));
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

  private static String manifest_sha(Path artifacts) throws Exception {
    return ProtocolClient.sha256Hex(Files.readAllBytes(artifacts.resolve("manifest.json")));
  }
}
