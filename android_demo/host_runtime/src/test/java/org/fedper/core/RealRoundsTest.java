package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.fedper.demo.ExecuTorchTrainer;
import org.fedper.demo.ExecuTorchTrainerTest;
import org.fedper.demo.HostRuntime;
import org.fedper.demo.PythonDevice;
import org.junit.After;
import org.junit.BeforeClass;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The Java core's round loop with the app's trainer on ExecuTorch's real runtime, against a real
 * `fedper serve` of the demo's real export: plain, DP and secure rounds. What the server publishes
 * is checked against the Python device (runtime_fixtures.py) trained on the same batches from the
 * same weights: bit for bit where the server averages floats, within the fixed-point bound where
 * it sums masked integers; under DP, the upload itself bit for bit (the published base has noise).
 */
public class RealRoundsTest {
  private static final String PROGRAM = "runtime/program";

  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private TestServer server;
  private final List<ExecuTorchTrainer> trainers = Collections.synchronizedList(new ArrayList<>());

  @BeforeClass public static void runtime() {
    HostRuntime.init();
  }

  @After public void stop() throws Exception {
    if (server != null) {
      server.stop();
    }
    for (ExecuTorchTrainer t : trainers) {
      t.close();
    }
  }

  /** The real trainer, remembering what each round gave it and fed it. */
  final class Recorded implements Trainer {
    final ExecuTorchTrainer inner;
    final List<Round> rounds = new ArrayList<>();

    Recorded(ExecuTorchTrainer inner) {
      this.inner = inner;
    }

    Round current() {
      return rounds.get(rounds.size() - 1);
    }

    @Override public void setBase(Map<String, Tensor> base) {
      rounds.add(new Round());
      current().start.putAll(base);
      inner.setBase(base);
    }

    @Override public void setHead(Map<String, Tensor> head) {
      current().start.putAll(head);
      inner.setHead(head);
    }

    @Override public void startRound(TrainConfig config) {
      current().config = config;
      inner.startRound(config);
    }

    @Override public float trainStep(LocalData.Batch batch) {
      current().batches.add(batch);
      return inner.trainStep(batch);
    }

    @Override public Map<String, Tensor> getBase() {
      return inner.getBase();
    }

    @Override public Map<String, Tensor> getHead() {
      return inner.getHead();
    }

    @Override public double evaluate(LocalData.Batch batch) throws Exception {
      return inner.evaluate(batch);
    }
  }

  static final class Round {
    final Map<String, Tensor> start = new LinkedHashMap<>();
    final List<LocalData.Batch> batches = new ArrayList<>();
    TrainConfig config;
  }

  /** A phone: its own store, photos (random pixels and ratings, no test split) and trainer. */
  final class Phone {
    final RoundLoopIntegrationTest.RecordingTransport http = new RoundLoopIntegrationTest.RecordingTransport();
    final RoundLoop loop;
    final int samples;
    Recorded trainer;

    Phone(String url, int samples, long seed) throws Exception {
      this.samples = samples;
      RoundBudget budget = RoundBudget.unlimited(Backoff.Sleeper.REAL);
      ProtocolClient client = new ProtocolClient(url, http, Backoff.standard(), new Random(seed), budget);
      LocalData photos = photos(samples, seed);
      this.loop = new RoundLoop(client, new DeviceStore(tmp.newFolder().toPath()), m -> photos, (dir, m) -> {
        ExecuTorchTrainer t = new ExecuTorchTrainer(dir, m, "1.5.1", () -> {
          throw new AssertionError("no test split: nothing to score");
        });
        trainers.add(t);
        trainer = new Recorded(t);
        return trainer;
      }, budget, 0.5, seed);
    }

    List<RoundLoop.Report> run() throws Exception {
      loop.ensureEnrolled(TestServer.ENROLL, "android-host-runtime-test");
      return loop.run(0);
    }
  }

  static LocalData photos(int n, long seed) {
    Random rng = new Random(seed);
    int pixels = 3 * 32 * 32;
    float[] x = new float[n * pixels];
    long[] y = new long[n];
    for (int k = 0; k < x.length; k++) {
      x[k] = (float) rng.nextGaussian();
    }
    for (int k = 0; k < n; k++) {
      y[k] = rng.nextInt(10);
    }
    return new LocalData() {
      @Override public int trainSize() {
        return n;
      }

      @Override public Batch trainBatch(int[] idx) {
        float[] px = new float[idx.length * pixels];
        long[] labels = new long[idx.length];
        for (int i = 0; i < idx.length; i++) {
          System.arraycopy(x, idx[i] * pixels, px, i * pixels, pixels);
          labels[i] = y[idx[i]];
        }
        return new Batch(px, labels);
      }

      @Override public Batch testSet() {
        return new Batch(new float[0], new long[0]);
      }
    };
  }

  private Map<String, Tensor> published(int version) throws Exception {
    HttpTransport.Response r = server.admin("GET", "/v1/models/" + version + "/base");
    assertEquals("GET /v1/models/" + version + "/base: " + server.log(), 200, r.status);
    return Safetensors.read(r.body).tensors;
  }

  private static Manifest manifest() throws Exception {
    return ExecuTorchTrainerTest.manifest(PythonDevice.export("program"));
  }

  private PythonDevice.Result python(Round round, Double clip) throws Exception {
    return PythonDevice.train(tmp.newFolder().toPath(), PythonDevice.export("program"), round.start, round.batches,
        round.config.learningRate, round.config.momentum, clip);
  }

  @Test public void twoPlainRoundsPublishWhatThePythonDeviceTrainsBitForBit() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), PROGRAM, 2, 1);
    Phone phone = new Phone(server.url, 20, 1);
    assertEquals(2, phone.run().size());
    Manifest m = manifest();
    List<Round> rounds = phone.trainer.rounds;
    assertEquals(2, rounds.size());
    for (int r = 0; r < 2; r++) {
      PythonDevice.Result python = python(rounds.get(r), null);
      Map<String, Tensor> v = published(r + 1);
      assertEquals("round " + (r + 1), List.of(), PythonDevice.differences(python.tensors, "", v));
      if (r == 0) { // round 2 starts from what was published and the head Python trained
        for (String n : m.headNames()) {
          assertEquals(n, python.tensors.get(n), rounds.get(1).start.get(n));
        }
        assertEquals(v, ExecuTorchTrainerTest.pick(rounds.get(1).start, m.baseNames()));
      }
    }
  }

  @Test public void aDpRoundUploadsTheClippedBaseThePythonDeviceWouldBitForBit() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), PROGRAM, 1, 1, "--round-timeout", "8", "--dp",
        "--checkin-window", "1", "--cohort-size", "1", "--dp-clip", "0.05", "--dp-clip-learning-rate", "0",
        "--dp-noise-multiplier", "0.5", "--dp-delta", "1e-5");
    Phone phone = new Phone(server.url, 20, 2);
    List<RoundLoop.Report> reports = phone.run();
    assertEquals(1, reports.size());
    assertEquals(1, reports.get(0).received);
    assertEquals(1, phone.http.uploads.size());
    PythonDevice.Result python = python(phone.trainer.rounds.get(0), 0.05);
    assertEquals(List.of(), PythonDevice.differences(python.tensors, "clipped.", phone.http.uploads.get(0).tensors));
    assertEquals(python.unclipped ? "1" : "0", phone.http.uploads.get(0).metadata.get(Protocol.Metadata.UNCLIPPED));
    published(1); // the round closed and published (with its noise)
  }

  @Test public void threePhonesInASecureRoundPublishThePythonDevicesMeanWithinTheFixedPointBound() throws Exception {
    server = new TestServer(tmp.getRoot().toPath(), PROGRAM, 1, 3, "--round-timeout", "90", "--secagg",
        "--checkin-window", "2", "--cohort-size", "3", "--over-selection", "1", "--secagg-stage-timeout", "20",
        "--start-devices", "3", "--secagg-clip", "1.0", "--secagg-weight-cap", "1000");
    int[] samples = {30, 10, 20};
    Phone[] phones = new Phone[3];
    RoundLoopIntegrationTest.DeviceRun[] runs = new RoundLoopIntegrationTest.DeviceRun[3];
    for (int d = 0; d < 3; d++) {
      Phone p = new Phone(server.url, samples[d], 10 + d);
      phones[d] = p;
      runs[d] = () -> assertEquals(1, p.run().size());
    }
    RoundLoopIntegrationTest.runConcurrently(runs);
    Manifest m = manifest();
    Map<String, Tensor> v0 = published(0);
    Map<String, Tensor> v1 = published(1);
    FixedPoint fixed = new FixedPoint(1.0, 3, 1000);
    double total = 0;
    Map<String, double[]> sum = new LinkedHashMap<>();
    for (Phone p : phones) {
      assertEquals(0, p.http.uploads.size()); // nothing in the clear
      PythonDevice.Result python = python(p.trainer.rounds.get(0), 1.0);
      double w = fixed.weight(p.samples);
      total += w;
      for (String n : m.baseNames()) {
        float[] c = python.tensors.get("clipped." + n).data();
        float[] b = v0.get(n).data();
        double[] s = sum.computeIfAbsent(n, k -> new double[c.length]);
        for (int k = 0; k < c.length; k++) {
          s[k] += w * ((double) c[k] - b[k]);
        }
      }
    }
    // Each device rounds each coordinate to the nearest word: up to half a word each, so the sum
    // is off by at most 3/2 words, a word being 1 / (scale x weight / cap) of the delta.
    double bound = 3 / (2 * fixed.scale()) * 1000 / total;
    double worst = 0;
    for (String n : m.baseNames()) {
      float[] got = v1.get(n).data();
      float[] b = v0.get(n).data();
      double[] s = sum.get(n);
      for (int k = 0; k < got.length; k++) {
        double want = b[k] + s[k] / total;
        double off = Math.abs(got[k] - want);
        worst = Math.max(worst, off);
        assertTrue(n + "[" + k + "]: published " + got[k] + ", Python's mean " + want,
            off <= bound + Math.ulp((float) want));
      }
    }
    System.out.printf("secure round: published base within %.3g of the Python devices' mean (bound %.3g)%n", worst, bound);
  }
}
