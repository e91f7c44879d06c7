package org.fedper.demo;

import static org.junit.Assert.assertEquals;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.fedper.core.LocalData;
import org.fedper.core.Safetensors;
import org.fedper.core.Tensor;
import org.json.JSONArray;
import org.json.JSONObject;

/**
 * The Python device's side of a comparison (runtime_fixtures.py train): a case is the weights to
 * start from and the batches of each step; Python trains on them with fedper's device runtime and
 * its results are read back here. Also where the fixtures are (-Dfedper.runtime.fixtures).
 */
public final class PythonDevice {
  private PythonDevice() {}

  public static Path export(String name) {
    return Paths.get(required("fedper.runtime.fixtures")).resolve(name);
  }

  /** What Python got: each step's loss, the first step's gradients, the base and head after the last. */
  public static final class Result {
    public final float[] losses;
    public final Map<String, Tensor> tensors;
    /** With a clip norm: whether the delta was within it before clipping (the upload's unclipped bit). */
    public final Boolean unclipped;

    Result(float[] losses, Map<String, Tensor> tensors, Boolean unclipped) {
      this.losses = losses;
      this.tensors = tensors;
      this.unclipped = unclipped;
    }
  }

  /**
   * Trains {@code export} from {@code weights} on {@code batches} in the Python device, in
   * {@code dir}; with {@code clipNorm} (null: none) also what a DP or secure round sends.
   */
  public static Result train(Path dir, Path export, Map<String, Tensor> weights, List<LocalData.Batch> batches,
      double learningRate, double momentum, Double clipNorm) throws Exception {
    Files.createDirectories(dir);
    JSONArray steps = new JSONArray();
    int bytes = 0;
    for (LocalData.Batch b : batches) {
      steps.put(new JSONArray().put(b.size()));
      bytes += 4 * b.pixels.length + 8 * b.labels.length;
    }
    ByteBuffer raw = ByteBuffer.allocate(bytes).order(ByteOrder.LITTLE_ENDIAN);
    for (LocalData.Batch b : batches) {
      for (float v : b.pixels) {
        raw.putFloat(v);
      }
      for (long v : b.labels) {
        raw.putLong(v);
      }
    }
    Files.write(dir.resolve("batches.bin"), raw.array());
    Files.write(dir.resolve("weights.safetensors"), Safetensors.write(weights, java.util.Collections.emptyMap()));
    JSONObject spec = new JSONObject().put("export", export.toString()).put("learning_rate", learningRate)
        .put("momentum", momentum).put("steps", steps);
    if (clipNorm != null) {
      spec.put("clip_norm", clipNorm.doubleValue());
    }
    Files.write(dir.resolve("case.json"), spec.toString().getBytes(StandardCharsets.UTF_8));
    Path log = dir.resolve("python.log");
    Process p = new ProcessBuilder(required("fedper.python"), required("fedper.runtime.script"), "train", dir.toString())
        .redirectErrorStream(true).redirectOutput(new File(log.toString())).start();
    assertEquals("runtime_fixtures.py train: " + new String(Files.readAllBytes(log), StandardCharsets.UTF_8),
        0, p.waitFor());
    JSONObject got = new JSONObject(new String(Files.readAllBytes(dir.resolve("python.json")), StandardCharsets.UTF_8));
    JSONArray bits = got.getJSONArray("loss_bits");
    float[] losses = new float[bits.length()];
    for (int k = 0; k < losses.length; k++) {
      losses[k] = Float.intBitsToFloat((int) bits.getLong(k));
    }
    return new Result(losses, Safetensors.read(Files.readAllBytes(dir.resolve("python.safetensors"))).tensors,
        got.has("unclipped") ? got.getBoolean("unclipped") : null);
  }

  /** Every tensor of {@code expected} (by name, under {@code prefix} in Python's) bit for bit, or which differs and by how much. */
  public static List<String> differences(Map<String, Tensor> python, String prefix, Map<String, Tensor> java) {
    List<String> out = new ArrayList<>();
    for (Map.Entry<String, Tensor> e : java.entrySet()) {
      Tensor want = python.get(prefix + e.getKey());
      if (want == null) {
        out.add(e.getKey() + ": not in Python's results");
        continue;
      }
      float[] a = e.getValue().data();
      float[] b = want.data();
      double worst = 0;
      int differ = 0;
      for (int k = 0; k < a.length; k++) {
        if (Float.floatToRawIntBits(a[k]) != Float.floatToRawIntBits(b[k])) {
          differ++;
          worst = Math.max(worst, Math.abs((double) a[k] - b[k]));
        }
      }
      if (differ > 0 || a.length != b.length) {
        out.add(e.getKey() + ": " + differ + " of " + a.length + " values differ, by up to " + worst);
      }
    }
    return out;
  }

  private static String required(String key) {
    String v = System.getProperty(key);
    if (v == null || v.isEmpty()) {
      throw new IllegalStateException("run through android_demo/core/host-test.sh (-D" + key + " is not set)");
    }
    return v;
  }
}
