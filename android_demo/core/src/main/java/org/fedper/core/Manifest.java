package org.fedper.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The parts of an export's manifest.json (format fedper-manifest/1) a device needs. */
public final class Manifest {
  public static final String FORMAT = "fedper-manifest/1";

  public final Map<String, Object> raw;
  public final Map<String, long[]> base;
  public final Map<String, long[]> head;
  public final Map<String, String> artifacts;
  public final Map<String, String> sha256;
  public final TrainConfig trainingDefaults;
  public final int inputSize;
  public final int numClasses;
  public final int maxBatch;

  private Manifest(Map<String, Object> raw) {
    this.raw = raw;
    Object format = raw.get("format");
    if (!FORMAT.equals(format)) {
      throw new IllegalArgumentException("manifest format is " + format + ", expected " + FORMAT);
    }
    Map<String, Object> tensors = map(raw, "tensors");
    this.base = layout(tensors, "base");
    this.head = layout(tensors, "head");
    this.artifacts = strings(map(raw, "artifacts"));
    this.sha256 = strings(map(raw, "sha256"));
    Map<String, Object> t = map(raw, "training");
    this.trainingDefaults =
        new TrainConfig(
            ((Number) t.get("local_epochs")).intValue(),
            ((Number) t.get("batch_size")).intValue(),
            ((Number) t.get("learning_rate")).doubleValue(),
            ((Number) t.get("momentum")).doubleValue());
    this.inputSize = ((Number) map(raw, "model").get("input_size")).intValue();
    this.numClasses = ((Number) map(raw, "output").get("num_classes")).intValue();
    this.maxBatch = ((Number) map(raw, "training_program").get("max_batch")).intValue();
    for (String name : head.keySet()) {
      if (base.containsKey(name)) {
        throw new IllegalArgumentException("tensor " + name + " is both base and head");
      }
    }
  }

  public static Manifest parse(String json) {
    try {
      return new Manifest(Json.parseObject(json));
    } catch (ClassCastException | NullPointerException ex) {
      throw new IllegalArgumentException("manifest.json does not have the fedper-manifest/1 fields", ex);
    }
  }

  /** The task's config on top of the manifest's defaults, key by key; batch capped by the program. */
  public TrainConfig trainConfig(Map<String, Object> overrides) {
    TrainConfig d = trainingDefaults;
    int batch = overrides.containsKey("batch_size") ? num(overrides, "batch_size").intValue() : d.batchSize;
    return new TrainConfig(
        overrides.containsKey("local_epochs") ? num(overrides, "local_epochs").intValue() : d.localEpochs,
        Math.min(batch, maxBatch),
        overrides.containsKey("learning_rate") ? num(overrides, "learning_rate").doubleValue() : d.learningRate,
        overrides.containsKey("momentum") ? num(overrides, "momentum").doubleValue() : d.momentum);
  }

  private static Number num(Map<String, Object> m, String key) {
    return (Number) m.get(key);
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> map(Map<String, Object> m, String key) {
    Object v = m.get(key);
    if (!(v instanceof Map)) {
      throw new IllegalArgumentException("manifest.json has no object '" + key + "'");
    }
    return (Map<String, Object>) v;
  }

  private static Map<String, String> strings(Map<String, Object> m) {
    Map<String, String> out = new LinkedHashMap<>();
    for (Map.Entry<String, Object> e : m.entrySet()) {
      out.put(e.getKey(), String.valueOf(e.getValue()));
    }
    return Collections.unmodifiableMap(out);
  }

  private static Map<String, long[]> layout(Map<String, Object> tensors, String part) {
    Map<String, long[]> out = new LinkedHashMap<>();
    for (Object item : (List<?>) tensors.get(part)) {
      Map<?, ?> t = (Map<?, ?>) item;
      List<?> dims = (List<?>) t.get("shape");
      long[] shape = new long[dims.size()];
      for (int k = 0; k < shape.length; k++) {
        shape[k] = ((Number) dims.get(k)).longValue();
      }
      out.put(String.valueOf(t.get("name")), shape);
    }
    return Collections.unmodifiableMap(out);
  }

  public List<String> baseNames() {
    return new ArrayList<>(base.keySet());
  }

  public List<String> headNames() {
    return new ArrayList<>(head.keySet());
  }
}
