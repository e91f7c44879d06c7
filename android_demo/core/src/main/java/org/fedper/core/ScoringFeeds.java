package org.fedper.core;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The feeds for one run of the exported ONNX model (model.onnx): the image under {@code input} and
 * every manifest base and head tensor under its own name, and nothing else. ONNX Runtime's Java
 * {@code OrtSession.run} refuses any name that is not one of the model's required inputs, so the
 * model's input names and the manifest must agree exactly; this class says which name does not.
 */
public final class ScoringFeeds {
  /** The name of the image input (float32 NCHW, dynamic batch) in every fedper ONNX export. */
  public static final String IMAGE = "input";

  private ScoringFeeds() {}

  /**
   * One entry per model input, in the model's input order.
   *
   * @param modelInputNames what the session reports as its inputs ({@code getInputNames()})
   * @throws IllegalArgumentException naming the missing, unexpected or misshaped tensor
   */
  public static Map<String, Tensor> feeds(
      Manifest manifest, Set<String> modelInputNames, Tensor image, Map<String, Tensor> weights) {
    Map<String, long[]> layout = new LinkedHashMap<>(manifest.base);
    layout.putAll(manifest.head);
    checkModelInputs(layout, modelInputNames);
    checkImage(manifest, image);
    Set<String> extra = new TreeSet<>(weights.keySet());
    extra.removeAll(layout.keySet());
    if (!extra.isEmpty()) {
      throw new IllegalArgumentException(
          "weights " + extra + " are not base or head tensors of the manifest; the model takes no such input");
    }
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (String name : modelInputNames) {
      if (name.equals(IMAGE)) {
        out.put(name, image);
        continue;
      }
      Tensor t = weights.get(name);
      if (t == null) {
        throw new IllegalArgumentException("no value for weight " + name + " (a model input the manifest lists)");
      }
      if (!Arrays.equals(t.shape(), layout.get(name))) {
        throw new IllegalArgumentException("weight " + name + " has shape " + Arrays.toString(t.shape())
            + ", the manifest says " + Arrays.toString(layout.get(name)));
      }
      out.put(name, t);
    }
    return out;
  }

  private static void checkModelInputs(Map<String, long[]> layout, Set<String> modelInputNames) {
    if (!modelInputNames.contains(IMAGE)) {
      throw new IllegalArgumentException("model.onnx has no image input '" + IMAGE + "'; its inputs are " + modelInputNames);
    }
    Set<String> unknown = new TreeSet<>(modelInputNames);
    unknown.remove(IMAGE);
    unknown.removeAll(layout.keySet());
    if (!unknown.isEmpty()) {
      throw new IllegalArgumentException("model.onnx takes inputs " + unknown
          + " that are neither the image nor a base or head tensor of the manifest");
    }
    Set<String> missing = new TreeSet<>(layout.keySet());
    missing.removeAll(modelInputNames);
    if (!missing.isEmpty()) {
      throw new IllegalArgumentException("model.onnx does not take the manifest tensors " + missing
          + " as inputs (an export that keeps weights as initializers cannot be scored with ONNX Runtime Java)");
    }
  }

  private static void checkImage(Manifest manifest, Tensor image) {
    long[] s = image.shape();
    int size = manifest.inputSize;
    if (s.length != 4 || s[0] < 1 || s[1] != 3 || s[2] != size || s[3] != size) {
      throw new IllegalArgumentException(
          "image has shape " + Arrays.toString(s) + ", expected [N, 3, " + size + ", " + size + "] (NCHW)");
    }
  }
}
