package org.fedper.demo;

import java.io.IOException;
import java.nio.FloatBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;
import org.fedper.core.RuntimeVersions;
import org.fedper.core.Tensor;
import org.fedper.core.TrainConfig;
import org.fedper.core.Trainer;
import org.fedper.core.TrainingMetadata;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.training.SGD;
import org.pytorch.executorch.training.TrainingModule;

/**
 * The exported training program (train.pte with the export's train.ptd) in ExecuTorch's training
 * runtime, as the Python device runs it: loaded once, checked against the manifest
 * (TrainingMetadata), and given each round's base and head by writing them into the runtime's own
 * parameter tensors (which alias its memory) rather than into a rewritten .ptd: the exporter's
 * .ptd stores equal tensors once (MobileNet-V1's 164 entries share 42 segments), so a file
 * rewritten in place would give every tensor of a shared segment the last one written. BatchNorm
 * running statistics are the method's inputs and outputs (loss first). With training.trainable
 * "head" only head tensors are stepped and updated: the base handed back is the base received, bit
 * for bit. No Android class: `make android-test` runs this with the real runtime on the host.
 * Closed by whoever created it (it holds the module and, once opened, a scorer).
 */
public final class ExecuTorchTrainer implements Trainer, AutoCloseable {
  private final Manifest manifest;
  private final boolean headOnly;
  private final Set<String> headNames;
  private final Scorer.Opener opener;
  private final TrainingModule module;
  /** The program's parameters: direct buffers over the runtime's memory, written and read in place. */
  private final Map<String, org.pytorch.executorch.Tensor> parameters;
  /** The BatchNorm statistics the next step takes (the method returns their new values). */
  private final Map<String, Tensor> statistics = new LinkedHashMap<>();
  private Scorer scorer;
  private SGD sgd;

  /**
   * Loads {@code dir}'s training program and checks it. {@code runtimeVersion}: the ExecuTorch
   * release the app bundles; {@code scorer}: opens evaluation's inference engine when needed.
   */
  public ExecuTorchTrainer(Path dir, Manifest manifest, String runtimeVersion, Scorer.Opener scorer) throws IOException {
    RuntimeVersions.requireLoadable(manifest.executorchVersion, runtimeVersion);
    if (!"all".equals(manifest.trainable) && !"head".equals(manifest.trainable)) {
      throw new IllegalArgumentException("manifest.json training.trainable is '" + manifest.trainable
          + "', expected 'all' or 'head'");
    }
    TrainingMetadata.checkCallingConvention(manifest);
    this.manifest = manifest;
    this.headOnly = "head".equals(manifest.trainable);
    this.headNames = new HashSet<>(manifest.headNames());
    if (headOnly && headNames.isEmpty()) {
      throw new IllegalArgumentException("manifest.json trains only the head (training.trainable 'head') but has no"
          + " head tensors (kp 0)");
    }
    this.opener = scorer;
    for (String name : manifest.bnStatistics) {
      statistics.put(name, Tensor.filled(shape(name), name.endsWith("running_var") ? 1f : 0f));
    }
    this.module = load(dir.resolve(manifest.artifacts.get("training_program")),
        dir.resolve(manifest.artifacts.get("training_weights")));
    try {
      // The runtime hands out its parameter tensors after a first forward and backward (no step:
      // the parameters stay as loaded; its outputs are only checked).
      int n = Math.max(2, manifest.minBatch);
      int size = manifest.inputSize;
      EValue[] out = module.executeForwardBackward(manifest.trainingMethod,
          inputs(new float[n * 3 * size * size], new long[n], n));
      this.parameters = module.namedParameters(manifest.trainingMethod);
      List<long[]> outputs = new ArrayList<>();
      for (EValue v : out) {
        outputs.add(v.toTensor().shape());
      }
      TrainingMetadata.checkProgram(manifest, shapes(parameters), shapes(module.namedGradients(manifest.trainingMethod)),
          outputs);
    } catch (RuntimeException ex) {
      module.close();
      throw ex;
    }
  }

  /** The native library loads in TrainingModule's static initializer: an Error, not an Exception. */
  private static TrainingModule load(Path program, Path weights) throws IOException {
    try {
      return TrainingModule.load(program.toString(), weights.toString());
    } catch (LinkageError err) {
      throw new IOException("ExecuTorch's native library did not load (" + err + "); the app ships it for"
          + " arm64-v8a and x86_64 only", err);
    }
  }

  private static Map<String, long[]> shapes(Map<String, org.pytorch.executorch.Tensor> tensors) {
    Map<String, long[]> out = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : tensors.entrySet()) {
      out.put(e.getKey(), e.getValue().shape());
    }
    return out;
  }

  private long[] shape(String name) {
    return manifest.base.containsKey(name) ? manifest.base.get(name) : manifest.head.get(name);
  }

  @Override public void setBase(Map<String, Tensor> base) {
    Manifest.checkLayout(base, manifest.base, "the base");
    write(base);
  }

  @Override public void setHead(Map<String, Tensor> head) {
    Manifest.checkLayout(head, manifest.head, "the head");
    write(head);
  }

  private void write(Map<String, Tensor> tensors) {
    for (Map.Entry<String, Tensor> e : tensors.entrySet()) {
      org.pytorch.executorch.Tensor live = parameters.get(e.getKey());
      if (live == null) {
        statistics.put(e.getKey(), e.getValue());
        continue;
      }
      FloatBuffer into = ((FloatBuffer) live.getRawDataBuffer()).duplicate();
      into.clear();
      into.put(e.getValue().data());
    }
  }

  private boolean trains(String name) {
    return !headOnly || headNames.contains(name);
  }

  @Override public void startRound(TrainConfig config) {
    Map<String, org.pytorch.executorch.Tensor> stepped = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : parameters.entrySet()) {
      if (trains(e.getKey())) {
        stepped.put(e.getKey(), e.getValue());
      }
    }
    sgd = SGD.create(stepped, config.learningRate, config.momentum, 0, 0, false);
  }

  @Override public float trainStep(LocalData.Batch batch) {
    if (sgd == null) {
      throw new IllegalStateException("startRound() before trainStep()");
    }
    if (batch.size() < manifest.minBatch || batch.size() > manifest.maxBatch) {
      throw new IllegalArgumentException("a batch of " + batch.size() + "; the training program takes "
          + manifest.minBatch + ".." + manifest.maxBatch);
    }
    EValue[] out = module.executeForwardBackward(manifest.trainingMethod, inputs(batch.pixels, batch.labels, batch.size()));
    float loss = out[0].toTensor().getDataAsFloatArray()[0];
    List<String> stats = manifest.bnStatistics;
    for (int k = 0; k < stats.size(); k++) {
      if (trains(stats.get(k))) { // a copy: the runtime reuses the output's memory at the next call
        org.pytorch.executorch.Tensor t = out[k + 1].toTensor();
        statistics.put(stats.get(k), new Tensor(t.shape(), t.getDataAsFloatArray()));
      }
    }
    Map<String, org.pytorch.executorch.Tensor> grads = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : module.namedGradients(manifest.trainingMethod).entrySet()) {
      if (trains(e.getKey())) {
        grads.put(e.getKey(), e.getValue());
      }
    }
    sgd.step(grads);
    return loss;
  }

  /** The gradients of the last step (or of the load's check), copied: for the host tests' parity checks. */
  public Map<String, Tensor> lastGradients() {
    return copies(module.namedGradients(manifest.trainingMethod));
  }

  private static Map<String, Tensor> copies(Map<String, org.pytorch.executorch.Tensor> tensors) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : tensors.entrySet()) {
      out.put(e.getKey(), new Tensor(e.getValue().shape(), e.getValue().getDataAsFloatArray()));
    }
    return out;
  }

  private EValue[] inputs(float[] pixels, long[] labels, int n) {
    int size = manifest.inputSize;
    List<String> stats = manifest.bnStatistics;
    EValue[] in = new EValue[2 + stats.size()];
    in[0] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(pixels, new long[] {n, 3, size, size}));
    in[1] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(labels, new long[] {n}));
    for (int k = 0; k < stats.size(); k++) {
      Tensor s = statistics.get(stats.get(k));
      in[2 + k] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(s.data(), s.shape()));
    }
    return in;
  }

  private Map<String, Tensor> pick(List<String> names) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (String name : names) {
      org.pytorch.executorch.Tensor live = parameters.get(name);
      out.put(name, live == null ? statistics.get(name) : new Tensor(live.shape(), live.getDataAsFloatArray()));
    }
    return out;
  }

  @Override public Map<String, Tensor> getBase() {
    return pick(manifest.baseNames());
  }

  @Override public Map<String, Tensor> getHead() {
    return pick(manifest.headNames());
  }

  /** Accuracy on the local test split; NaN when it is empty (the round loop then sends no metric). */
  @Override public double evaluate(LocalData.Batch batch) throws Exception {
    if (batch.size() == 0) {
      return Double.NaN;
    }
    if (scorer == null) {
      scorer = opener.open();
    }
    Map<String, Tensor> weights = pick(manifest.baseNames());
    weights.putAll(pick(manifest.headNames()));
    int correct = 0;
    int pixels = batch.pixels.length / batch.size();
    for (int i = 0; i < batch.size(); i++) {
      float[] one = new float[pixels];
      System.arraycopy(batch.pixels, i * pixels, one, 0, pixels);
      if (argmax(scorer.logits(one, weights)) == batch.labels[i]) {
        correct++;
      }
    }
    return (double) correct / batch.size();
  }

  private static int argmax(float[] v) {
    int best = 0;
    for (int k = 1; k < v.length; k++) {
      if (v[k] > v[best]) {
        best = k;
      }
    }
    return best;
  }

  @Override public void close() throws IOException {
    try {
      module.close();
    } finally {
      if (scorer != null) {
        scorer.close();
      }
    }
  }
}
