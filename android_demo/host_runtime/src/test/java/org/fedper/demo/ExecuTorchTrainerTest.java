package org.fedper.demo;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;
import org.fedper.core.Tensor;
import org.fedper.core.TrainConfig;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.BeforeClass;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The app's trainer with ExecuTorch's real training runtime (its Kotlin API and JNI, built for the
 * host by host_runtime/build.sh, over the executorch 1.5.1 wheel's kernels) on the demo's exported
 * program: the same losses, gradients and weights as the Python device, bit for bit, and the
 * manifest's training_program checked as the Python device checks it.
 */
public class ExecuTorchTrainerTest {
  private static final double LR = 0.05;
  private static final double MOMENTUM = 0.9;

  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  @BeforeClass public static void runtime() {
    HostRuntime.init();
  }

  public static Manifest manifest(Path export) throws Exception {
    return Manifest.parse(new String(Files.readAllBytes(export.resolve("manifest.json")), StandardCharsets.UTF_8));
  }

  static ExecuTorchTrainer trainer(Path export, Manifest m) throws Exception {
    return new ExecuTorchTrainer(export, m, "1.5.1", () -> {
      throw new AssertionError("nothing to score: the host tests' test splits are empty");
    });
  }

  /** The export's initial base and head, moved by a seeded amount (not what train.ptd holds). */
  static Map<String, Tensor> startingWeights(Path export, Manifest m, long seed) throws Exception {
    Map<String, Tensor> out = new LinkedHashMap<>();
    out.putAll(Manifest.readChecked(export.resolve(m.artifacts.get("initial_base")), m.base));
    out.putAll(Manifest.readChecked(export.resolve(m.artifacts.get("initial_head")), m.head));
    Random rng = new Random(seed);
    for (Map.Entry<String, Tensor> e : out.entrySet()) {
      float[] v = e.getValue().data().clone();
      boolean variance = e.getKey().endsWith("running_var");
      for (int k = 0; k < v.length; k++) {
        v[k] = variance ? 0.5f + rng.nextFloat() : v[k] + 0.02f * (float) rng.nextGaussian();
      }
      e.setValue(new Tensor(e.getValue().shape(), v));
    }
    return out;
  }

  static List<LocalData.Batch> batches(Manifest m, long seed, int... sizes) {
    Random rng = new Random(seed);
    List<LocalData.Batch> out = new ArrayList<>();
    int pixels = 3 * m.inputSize * m.inputSize;
    for (int n : sizes) {
      float[] x = new float[n * pixels];
      long[] y = new long[n];
      for (int k = 0; k < x.length; k++) {
        x[k] = (float) rng.nextGaussian();
      }
      for (int k = 0; k < n; k++) {
        y[k] = rng.nextInt(m.numClasses);
      }
      out.add(new LocalData.Batch(x, y));
    }
    return out;
  }

  public static Map<String, Tensor> pick(Map<String, Tensor> all, List<String> names) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (String n : names) {
      out.put(n, all.get(n));
    }
    return out;
  }

  /** Trains in Java and in the Python device from the same weights on the same batches; both results. */
  private void compare(String exportName) throws Exception {
    Path export = PythonDevice.export(exportName);
    Manifest m = manifest(export);
    Map<String, Tensor> start = startingWeights(export, m, 7);
    List<LocalData.Batch> steps = batches(m, 11, 8, 8, 2, m.maxBatch);
    float[] losses = new float[steps.size()];
    Map<String, Tensor> grads;
    Map<String, Tensor> after = new LinkedHashMap<>();
    try (ExecuTorchTrainer t = trainer(export, m)) {
      t.setBase(pick(start, m.baseNames()));
      t.setHead(pick(start, m.headNames()));
      t.startRound(new TrainConfig(1, 8, LR, MOMENTUM));
      losses[0] = t.trainStep(steps.get(0));
      grads = t.lastGradients();
      for (int k = 1; k < steps.size(); k++) {
        losses[k] = t.trainStep(steps.get(k));
      }
      after.putAll(t.getBase());
      after.putAll(t.getHead());
    }
    PythonDevice.Result python = PythonDevice.train(tmp.newFolder().toPath(), export, start, steps, LR, MOMENTUM, null);
    for (int k = 0; k < losses.length; k++) {
      assertEquals("step " + k + "'s loss, Java " + losses[k] + " Python " + python.losses[k],
          Float.floatToRawIntBits(python.losses[k]), Float.floatToRawIntBits(losses[k]));
    }
    assertEquals(List.of(), PythonDevice.differences(python.tensors, "grad.", grads));
    assertEquals(List.of(), PythonDevice.differences(python.tensors, "", after));
    if ("head".equals(m.trainable)) { // the base handed back is the base received, bit for bit
      for (String n : m.baseNames()) {
        assertArrayEquals(n, start.get(n).data(), after.get(n).data(), 0f);
      }
    }
    boolean moved = false;
    for (String n : m.headNames()) {
      moved |= !java.util.Arrays.equals(start.get(n).data(), after.get(n).data());
    }
    assertTrue("training moved the head", moved);
  }

  @Test public void trainsAsThePythonDeviceDoesBitForBit() throws Exception {
    compare("program");
  }

  @Test public void aHeadOnlyExportMovesOnlyTheHeadAsThePythonDeviceDoes() throws Exception {
    compare("program-head");
  }

  @Test public void theWeightsSetAreTheWeightsTheProgramHolds() throws Exception {
    Path export = PythonDevice.export("program");
    Manifest m = manifest(export);
    Map<String, Tensor> start = startingWeights(export, m, 3);
    try (ExecuTorchTrainer t = trainer(export, m)) {
      t.setBase(pick(start, m.baseNames()));
      t.setHead(pick(start, m.headNames()));
      Map<String, Tensor> back = new LinkedHashMap<>(t.getBase());
      back.putAll(t.getHead());
      for (Map.Entry<String, Tensor> e : start.entrySet()) { // tensors sharing a .ptd segment stay apart
        assertArrayEquals(e.getKey(), e.getValue().data(), back.get(e.getKey()).data(), 0f);
      }
    }
  }

  interface Edit {
    void apply(JSONObject manifest) throws Exception;
  }

  /** manifest.json's text with one edit, parsed. */
  private static Manifest edited(Path export, Edit edit) throws Exception {
    JSONObject json = new JSONObject(new String(Files.readAllBytes(export.resolve("manifest.json")), StandardCharsets.UTF_8));
    edit.apply(json);
    return Manifest.parse(json.toString());
  }

  private static String refusal(Path export, Manifest m) {
    Exception e = assertThrows(Exception.class, () -> trainer(export, m).close());
    return e.getMessage();
  }

  @Test public void aProgramThatIsNotTheManifestsIsRefusedWithWhatDiffers() throws Exception {
    Path export = PythonDevice.export("program");
    // A parameter the manifest does not list: the convention check names it.
    String msg = refusal(export, edited(export, j -> j.getJSONObject("training_program").getJSONArray("parameters").remove(0)));
    assertTrue(msg, msg.contains("training_program.parameters and bn_statistics") && msg.contains("stem.conv.weight"));
    // A tensor the manifest lists (base and parameters) that the program does not have.
    msg = refusal(export, edited(export, j -> {
      j.getJSONObject("tensors").getJSONArray("base").put(new JSONObject().put("name", "extra.weight")
          .put("shape", new JSONArray().put(3)).put("dtype", "float32"));
      j.getJSONObject("training_program").getJSONArray("parameters").put("extra.weight");
    }));
    assertTrue(msg, msg.contains("missing [extra.weight]"));
    // A shape that is not the program's.
    msg = refusal(export, edited(export, j -> j.getJSONObject("tensors").getJSONArray("head").getJSONObject(0)
        .put("shape", new JSONArray().put(1).put(2))));
    assertTrue(msg, msg.contains("has shape") && msg.contains("manifest.json says [1, 2]"));
    // Inputs in another order, outputs of another count.
    msg = refusal(export, edited(export, j -> {
      JSONArray in = j.getJSONObject("training_program").getJSONArray("inputs");
      Object x = in.get(0);
      in.put(0, in.get(1)).put(1, x);
    }));
    assertTrue(msg, msg.contains("training_program.inputs"));
    msg = refusal(export, edited(export, j -> j.getJSONObject("training_program").getJSONArray("outputs").remove(1)));
    assertTrue(msg, msg.contains("training_program.outputs"));
  }

  @Test public void aBaseOrHeadWithAMissingOrExtraTensorIsRefused() throws Exception {
    Path export = PythonDevice.export("program");
    Manifest m = manifest(export);
    Map<String, Tensor> start = startingWeights(export, m, 5);
    try (ExecuTorchTrainer t = trainer(export, m)) {
      Map<String, Tensor> base = pick(start, m.baseNames());
      base.remove(m.baseNames().get(0));
      Exception e = assertThrows(IllegalArgumentException.class, () -> t.setBase(base));
      assertTrue(e.getMessage(), e.getMessage().contains("lacks tensor " + m.baseNames().get(0)));
      Map<String, Tensor> head = pick(start, m.headNames());
      head.put(m.baseNames().get(0), start.get(m.baseNames().get(0))); // a base tensor sent as personal
      e = assertThrows(IllegalArgumentException.class, () -> t.setHead(head));
      assertTrue(e.getMessage(), e.getMessage().contains("which the manifest does not list there"));
      t.startRound(new TrainConfig(1, 8, LR, MOMENTUM));
      e = assertThrows(IllegalArgumentException.class, () -> t.trainStep(batches(m, 1, 1).get(0)));
      assertTrue(e.getMessage(), e.getMessage().contains("a batch of 1"));
      assertFalse(Float.isNaN(t.trainStep(batches(m, 1, 2).get(0))));
    }
  }
}
