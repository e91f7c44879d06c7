package org.fedper.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The parts of an export's manifest.json (format fedper-manifest/1) a device needs, as typed
 * fields, read through the names generated from its schema (ManifestKeys, from
 * docs/manifest.schema.json). Optional fields take the schema's defaults, generated too
 * (ManifestKeys.*_DEFAULT); a missing or malformed required field is an
 * IllegalArgumentException naming it.
 */
public final class Manifest {
  public static final String FORMAT = ManifestKeys.FORMAT;
  private static final String FILE = "manifest.json";

  public final Map<String, long[]> base;
  public final Map<String, long[]> head;
  public final Map<String, String> artifacts;
  public final Map<String, String> sha256;
  public final TrainConfig trainingDefaults;
  public final int inputSize;
  public final int numClasses;
  /** training_program.method: the method the training program exports. */
  public final String trainingMethod;
  /** training_program.bn_statistics: running statistics the program takes and returns. */
  public final List<String> bnStatistics;
  /** training_program.parameters: the program's trainable tensors, as the program names them. */
  public final List<String> trainingParameters;
  /** training_program.inputs: what the method takes, in order (the images, the labels, then the statistics). */
  public final List<String> trainingInputs;
  /** training_program.outputs: what the method returns, in order (the loss, then the statistics). */
  public final List<String> trainingOutputs;
  public final int minBatch;
  public final int maxBatch;
  /** training.trainable: all (base and head) or head only (the base is uploaded unchanged). */
  public final String trainable;
  /** input.normalization, per RGB channel: (pixel in [0, 1] - mean) / std. */
  public final float[] normalizationMean;
  public final float[] normalizationStd;
  /** runtime.executorch: the executorch version that wrote the programs; null in old manifests. */
  public final String executorchVersion;
  /** runtime.onnx_opset: the opset model.onnx was exported with; -1 when the manifest predates it. */
  public final int onnxOpset;

  private Manifest(JsonFields m) {
    String format = m.string(ManifestKeys.Manifest.FORMAT);
    if (!FORMAT.equals(format)) {
      throw new IllegalArgumentException(m.where(ManifestKeys.Manifest.FORMAT) + " is \"" + format + "\", expected " + FORMAT);
    }
    JsonFields tensors = m.object(ManifestKeys.Manifest.TENSORS);
    this.base = layout(tensors, ManifestKeys.Tensors.BASE);
    this.head = layout(tensors, ManifestKeys.Tensors.HEAD);
    for (String name : head.keySet()) {
      if (base.containsKey(name)) {
        throw new IllegalArgumentException(FILE + ": tensor " + name + " is both base and head");
      }
    }
    this.artifacts = m.stringMap(ManifestKeys.Manifest.ARTIFACTS);
    this.sha256 = m.stringMap(ManifestKeys.Manifest.SHA256);
    JsonFields t = m.object(ManifestKeys.Manifest.TRAINING);
    this.trainingDefaults =
        new TrainConfig(
            t.integer(ManifestKeys.TrainingDefaults.LOCAL_EPOCHS, ManifestKeys.TrainingDefaults.LOCAL_EPOCHS_DEFAULT),
            t.integer(ManifestKeys.TrainingDefaults.BATCH_SIZE, ManifestKeys.TrainingDefaults.BATCH_SIZE_DEFAULT),
            t.number(ManifestKeys.TrainingDefaults.LEARNING_RATE, ManifestKeys.TrainingDefaults.LEARNING_RATE_DEFAULT),
            t.number(ManifestKeys.TrainingDefaults.MOMENTUM, ManifestKeys.TrainingDefaults.MOMENTUM_DEFAULT));
    this.trainable = t.choice(ManifestKeys.TrainingDefaults.TRAINABLE, ManifestKeys.TrainingDefaults.TRAINABLE_CHOICES);
    this.inputSize = Math.toIntExact(m.object(ManifestKeys.Manifest.MODEL).integer(ManifestKeys.ModelSpec.INPUT_SIZE));
    this.numClasses = Math.toIntExact(m.object(ManifestKeys.Manifest.OUTPUT).integer(ManifestKeys.OutputSpec.NUM_CLASSES));
    JsonFields program = m.object(ManifestKeys.Manifest.TRAINING_PROGRAM);
    this.trainingMethod = program.string(ManifestKeys.TrainingProgramSpec.METHOD, ManifestKeys.TrainingProgramSpec.METHOD_DEFAULT);
    this.bnStatistics = program.strings(ManifestKeys.TrainingProgramSpec.BN_STATISTICS);
    this.trainingParameters = program.strings(ManifestKeys.TrainingProgramSpec.PARAMETERS);
    this.trainingInputs = program.strings(ManifestKeys.TrainingProgramSpec.INPUTS);
    this.trainingOutputs = program.strings(ManifestKeys.TrainingProgramSpec.OUTPUTS);
    this.minBatch = program.integer(ManifestKeys.TrainingProgramSpec.MIN_BATCH, ManifestKeys.TrainingProgramSpec.MIN_BATCH_DEFAULT);
    this.maxBatch = Math.toIntExact(program.integer(ManifestKeys.TrainingProgramSpec.MAX_BATCH));
    if (minBatch < 1 || maxBatch < minBatch) {
      throw new IllegalArgumentException(program.where(ManifestKeys.TrainingProgramSpec.MAX_BATCH) + " is " + maxBatch
          + ", must be at least training_program.min_batch (" + minBatch + ")");
    }
    JsonFields norm = m.object(ManifestKeys.Manifest.INPUT).object(ManifestKeys.InputSpec.NORMALIZATION);
    this.normalizationMean = norm.floats(ManifestKeys.Normalization.MEAN, 3);
    this.normalizationStd = norm.floats(ManifestKeys.Normalization.STD, 3);
    for (int c = 0; c < 3; c++) {
      if (!(normalizationStd[c] > 0)) {
        throw new IllegalArgumentException(norm.where(ManifestKeys.Normalization.STD) + " must be positive, got " + normalizationStd[c]);
      }
    }
    this.executorchVersion = m.has(ManifestKeys.Manifest.RUNTIME) ? m.object(ManifestKeys.Manifest.RUNTIME).string(ManifestKeys.RuntimeSpec.EXECUTORCH, null) : null;
    this.onnxOpset = m.has(ManifestKeys.Manifest.RUNTIME) ? m.object(ManifestKeys.Manifest.RUNTIME).integer(ManifestKeys.RuntimeSpec.ONNX_OPSET, -1) : -1;
  }

  /** Parses manifest.json's text; IllegalArgumentException naming the first bad field. */
  public static Manifest parse(String json) {
    return new Manifest(JsonFields.parse(json, FILE));
  }

  /** The task's config on top of the manifest's defaults, key by key; batch capped by the program. */
  public TrainConfig trainConfig(Map<String, Object> overrides) {
    TrainConfig d = trainingDefaults;
    int batch = overrides.containsKey(Protocol.Body.TaskConfig.BATCH_SIZE) ? (int) integral(overrides, Protocol.Body.TaskConfig.BATCH_SIZE) : d.batchSize;
    return new TrainConfig(
        overrides.containsKey(Protocol.Body.TaskConfig.LOCAL_EPOCHS) ? (int) integral(overrides, Protocol.Body.TaskConfig.LOCAL_EPOCHS) : d.localEpochs,
        Math.min(batch, maxBatch),
        overrides.containsKey(Protocol.Body.TaskConfig.LEARNING_RATE) ? num(overrides, Protocol.Body.TaskConfig.LEARNING_RATE) : d.learningRate,
        overrides.containsKey(Protocol.Body.TaskConfig.MOMENTUM) ? num(overrides, Protocol.Body.TaskConfig.MOMENTUM) : d.momentum);
  }

  private static double num(Map<String, Object> m, String key) {
    Object v = m.get(key);
    if (!(v instanceof Number)) {
      throw new IllegalArgumentException("task config: '" + key + "' must be a number, got " + v);
    }
    return ((Number) v).doubleValue();
  }

  private static long integral(Map<String, Object> m, String key) {
    return JsonFields.integral(m.get(key), "task config: '" + key + "'");
  }

  private static Map<String, long[]> layout(JsonFields tensors, String part) {
    Map<String, long[]> out = new LinkedHashMap<>();
    int n = tensors.array(part).length();
    for (int k = 0; k < n; k++) {
      JsonFields entry = tensors.element(part, k);
      long[] shape = entry.longs(ManifestKeys.TensorEntry.SHAPE);
      for (long d : shape) {
        if (d < 0) {
          throw new IllegalArgumentException(entry.where(ManifestKeys.TensorEntry.SHAPE) + " has a negative dimension");
        }
      }
      String name = entry.string(ManifestKeys.TensorEntry.NAME);
      if (out.put(name, shape) != null) {
        throw new IllegalArgumentException(entry.where(ManifestKeys.TensorEntry.NAME) + ": " + name + " is listed twice");
      }
    }
    return Collections.unmodifiableMap(out);
  }

  /** A weights file whose tensors are exactly expected (checkLayout), naming the file in any error. */
  public static Map<String, Tensor> readChecked(java.nio.file.Path file, Map<String, long[]> expected)
      throws java.io.IOException {
    Map<String, Tensor> tensors = Safetensors.read(java.nio.file.Files.readAllBytes(file)).tensors;
    checkLayout(tensors, expected, file.toString());
    return tensors;
  }

  /**
   * Refuses tensors whose names or shapes are not exactly expected (a missing, extra or
   * misshaped tensor), naming what was read and the first difference.
   */
  public static void checkLayout(Map<String, Tensor> tensors, Map<String, long[]> expected, String what) {
    for (Map.Entry<String, long[]> e : expected.entrySet()) {
      Tensor t = tensors.get(e.getKey());
      if (t == null) {
        throw new IllegalArgumentException(what + " lacks tensor " + e.getKey());
      }
      if (!java.util.Arrays.equals(t.shape(), e.getValue())) {
        throw new IllegalArgumentException(what + ": tensor " + e.getKey() + " has shape "
            + java.util.Arrays.toString(t.shape()) + ", expected " + java.util.Arrays.toString(e.getValue()));
      }
    }
    for (String name : tensors.keySet()) {
      if (!expected.containsKey(name)) {
        throw new IllegalArgumentException(what + " has tensor " + name + ", which the manifest does not list there");
      }
    }
  }

  public List<String> baseNames() {
    return new ArrayList<>(base.keySet());
  }

  public List<String> headNames() {
    return new ArrayList<>(head.keySet());
  }
}
