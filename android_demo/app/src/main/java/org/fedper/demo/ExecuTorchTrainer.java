package org.fedper.demo;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.fedper.core.AtomicFiles;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;
import org.fedper.core.PtdFile;
import org.fedper.core.RuntimeVersions;
import org.fedper.core.Tensor;
import org.fedper.core.TrainConfig;
import org.fedper.core.Trainer;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.training.SGD;
import org.pytorch.executorch.training.TrainingModule;

/**
 * The exported training program (train.pte) in ExecuTorch's Android training runtime. Each round
 * the received base and the device's own head are written into a copy of the export's weight file
 * (train.ptd, same layout) and the program is loaded with it. BatchNorm running statistics are
 * inputs and outputs of the training method (loss first), exactly as the manifest's
 * training_program section lists them, because TrainingModule exposes no buffers. With
 * training.trainable "head" only head tensors are stepped and updated: the base handed back is the
 * base received, bit for bit. Closed by whoever created it (it holds the module and a scorer).
 */
final class ExecuTorchTrainer implements Trainer, AutoCloseable {
  private final Path dir;
  private final Manifest manifest;
  private final boolean headOnly;
  private final Set<String> headNames;
  private final Map<String, Tensor> current = new LinkedHashMap<>();
  private final OnnxScorer scorer;
  private TrainingModule module;
  private SGD sgd;

  ExecuTorchTrainer(Path dir, Manifest manifest) throws IOException {
    RuntimeVersions.requireLoadable(manifest.executorchVersion, BuildConfig.EXECUTORCH_VERSION);
    if (!"all".equals(manifest.trainable) && !"head".equals(manifest.trainable)) {
      throw new IllegalArgumentException("manifest.json training.trainable is '" + manifest.trainable
          + "', expected 'all' or 'head'");
    }
    this.dir = dir;
    this.manifest = manifest;
    this.headOnly = "head".equals(manifest.trainable);
    this.headNames = new HashSet<>(manifest.headNames());
    this.scorer = new OnnxScorer(dir.resolve(manifest.artifacts.get("onnx_model")), manifest);
  }

  @Override public void setBase(Map<String, Tensor> base) {
    closeModule();
    current.putAll(base);
  }

  @Override public void setHead(Map<String, Tensor> head) {
    closeModule();
    current.putAll(head);
  }

  private void closeModule() {
    TrainingModule old = module;
    module = null;
    sgd = null;
    if (old != null) {
      old.close();
    }
  }

  @Override public void startRound(TrainConfig config) throws IOException {
    closeModule();
    PtdFile ptd = new PtdFile(Files.readAllBytes(dir.resolve(manifest.artifacts.get("training_weights"))));
    Map<String, Tensor> params = new LinkedHashMap<>();
    for (String name : ptd.shapes().keySet()) {
      if (current.containsKey(name)) {
        params.put(name, current.get(name));
      }
    }
    ptd.set(params);
    Path roundWeights = dir.resolve("round.ptd");
    AtomicFiles.write(roundWeights, ptd.toBytes());
    module = load(dir.resolve(manifest.artifacts.get("training_program")), roundWeights);
    // The runtime hands out its parameter tensors after a first forward_backward (no SGD step:
    // the parameters stay as loaded; its statistics outputs are discarded).
    int n = Math.max(2, manifest.minBatch);
    int size = manifest.inputSize;
    module.executeForwardBackward(manifest.trainingMethod, inputs(new float[n * 3 * size * size], new long[n], n));
    Map<String, org.pytorch.executorch.Tensor> named = module.namedParameters(manifest.trainingMethod);
    if (!named.keySet().equals(new HashSet<>(manifest.trainingParameters))) {
      Set<String> missing = new TreeSet<>(manifest.trainingParameters);
      missing.removeAll(named.keySet());
      Set<String> extra = new TreeSet<>(named.keySet());
      extra.removeAll(manifest.trainingParameters);
      throw new IllegalStateException("train.pte's parameters do not match manifest.json training_program.parameters:"
          + " missing " + missing + ", unexpected " + extra);
    }
    Map<String, org.pytorch.executorch.Tensor> stepped = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : named.entrySet()) {
      if (trains(e.getKey())) {
        stepped.put(e.getKey(), e.getValue());
      }
    }
    sgd = SGD.create(stepped, config.learningRate, config.momentum, 0, 0, false);
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

  private boolean trains(String name) {
    return !headOnly || headNames.contains(name);
  }

  @Override public float trainStep(LocalData.Batch batch) {
    EValue[] out = module.executeForwardBackward(manifest.trainingMethod, inputs(batch.pixels, batch.labels, batch.size()));
    List<String> stats = manifest.bnStatistics;
    for (int k = 0; k < stats.size(); k++) {
      if (trains(stats.get(k))) {
        org.pytorch.executorch.Tensor t = out[k + 1].toTensor();
        current.put(stats.get(k), new Tensor(t.shape(), t.getDataAsFloatArray()));
      }
    }
    Map<String, org.pytorch.executorch.Tensor> grads = new LinkedHashMap<>();
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : module.namedGradients(manifest.trainingMethod).entrySet()) {
      if (trains(e.getKey())) {
        grads.put(e.getKey(), e.getValue());
      }
    }
    sgd.step(grads);
    return out[0].toTensor().getDataAsFloatArray()[0];
  }

  private EValue[] inputs(float[] pixels, long[] labels, int n) {
    int size = manifest.inputSize;
    List<String> stats = manifest.bnStatistics;
    EValue[] in = new EValue[2 + stats.size()];
    in[0] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(pixels, new long[] {n, 3, size, size}));
    in[1] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(labels, new long[] {n}));
    for (int k = 0; k < stats.size(); k++) {
      Tensor s = current.get(stats.get(k));
      in[2 + k] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(s.data(), s.shape()));
    }
    return in;
  }

  /** Copies the trained values out of the runtime; frozen (base, head-only) tensors stay as received. */
  private void syncFromModule() {
    if (module == null) {
      return;
    }
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : module.namedParameters(manifest.trainingMethod).entrySet()) {
      if (trains(e.getKey())) {
        current.put(e.getKey(), new Tensor(e.getValue().shape(), e.getValue().getDataAsFloatArray()));
      }
    }
  }

  private Map<String, Tensor> pick(List<String> names) {
    syncFromModule();
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (String name : names) {
      out.put(name, current.get(name));
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
    syncFromModule();
    int correct = 0;
    int pixels = batch.pixels.length / batch.size();
    for (int i = 0; i < batch.size(); i++) {
      float[] one = new float[pixels];
      System.arraycopy(batch.pixels, i * pixels, one, 0, pixels);
      if (OnnxScorer.argmax(scorer.logits(one, current)) == batch.labels[i]) {
        correct++;
      }
    }
    return (double) correct / batch.size();
  }

  @Override public void close() throws ai.onnxruntime.OrtException {
    closeModule();
    scorer.close();
  }
}
