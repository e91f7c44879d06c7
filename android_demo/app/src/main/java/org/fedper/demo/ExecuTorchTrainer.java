package org.fedper.demo;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fedper.core.AtomicFiles;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;
import org.fedper.core.PtdFile;
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
 * training_program section lists them, because TrainingModule exposes no buffers.
 */
final class ExecuTorchTrainer implements Trainer {
  private final Path dir;
  private final Manifest manifest;
  private final String method;
  private final List<String> statNames = new ArrayList<>();
  private final Map<String, org.fedper.core.Tensor> current = new LinkedHashMap<>();
  private final OnnxScorer scorer;
  private TrainingModule module;
  private SGD sgd;

  ExecuTorchTrainer(Path dir, Manifest manifest) throws IOException {
    this.dir = dir;
    this.manifest = manifest;
    Map<?, ?> spec = (Map<?, ?>) manifest.raw.get("training_program");
    this.method = String.valueOf(spec.get("method"));
    for (Object name : (List<?>) spec.get("bn_statistics")) {
      statNames.add(String.valueOf(name));
    }
    this.scorer = new OnnxScorer(dir.resolve(manifest.artifacts.get("onnx_model")), manifest);
  }

  @Override public void setBase(Map<String, org.fedper.core.Tensor> base) {
    current.putAll(base);
    module = null;
  }

  @Override public void setHead(Map<String, org.fedper.core.Tensor> head) {
    current.putAll(head);
    module = null;
  }

  @Override public void startRound(TrainConfig config) throws IOException {
    PtdFile ptd = new PtdFile(Files.readAllBytes(dir.resolve(manifest.artifacts.get("training_weights"))));
    Map<String, org.fedper.core.Tensor> params = new LinkedHashMap<>();
    for (String name : ptd.shapes().keySet()) {
      if (current.containsKey(name)) {
        params.put(name, current.get(name));
      }
    }
    ptd.set(params);
    Path roundWeights = dir.resolve("round.ptd");
    AtomicFiles.write(roundWeights, ptd.toBytes());
    if (module != null) {
      module.destroy();
    }
    module = TrainingModule.load(dir.resolve(manifest.artifacts.get("training_program")).toString(),
        roundWeights.toString());
    // The runtime hands out its parameter tensors after a first forward_backward (no SGD step:
    // the parameters stay as loaded; its statistics outputs are discarded).
    int n = 2;
    int size = manifest.inputSize;
    module.executeForwardBackward(method, inputs(new float[n * 3 * size * size], new long[n], n));
    sgd = SGD.create(module.namedParameters(method), config.learningRate, config.momentum, 0, 0, false);
  }

  @Override public float trainStep(LocalData.Batch batch) {
    EValue[] out = module.executeForwardBackward(method, inputs(batch.pixels, batch.labels, batch.size()));
    for (int k = 0; k < statNames.size(); k++) {
      org.pytorch.executorch.Tensor t = out[k + 1].toTensor();
      current.put(statNames.get(k), new org.fedper.core.Tensor(t.shape(), t.getDataAsFloatArray()));
    }
    sgd.step(module.namedGradients(method));
    return out[0].toTensor().getDataAsFloatArray()[0];
  }

  private EValue[] inputs(float[] pixels, long[] labels, int n) {
    int size = manifest.inputSize;
    EValue[] in = new EValue[2 + statNames.size()];
    in[0] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(pixels, new long[] {n, 3, size, size}));
    in[1] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(labels, new long[] {n}));
    for (int k = 0; k < statNames.size(); k++) {
      org.fedper.core.Tensor s = current.get(statNames.get(k));
      in[2 + k] = EValue.from(org.pytorch.executorch.Tensor.fromBlob(s.data(), s.shape()));
    }
    return in;
  }

  private void syncFromModule() {
    if (module == null) {
      return;
    }
    for (Map.Entry<String, org.pytorch.executorch.Tensor> e : module.namedParameters(method).entrySet()) {
      current.put(e.getKey(), new org.fedper.core.Tensor(e.getValue().shape(), e.getValue().getDataAsFloatArray()));
    }
  }

  private Map<String, org.fedper.core.Tensor> pick(List<String> names) {
    syncFromModule();
    Map<String, org.fedper.core.Tensor> out = new LinkedHashMap<>();
    for (String name : names) {
      out.put(name, current.get(name));
    }
    return out;
  }

  @Override public Map<String, org.fedper.core.Tensor> getBase() {
    return pick(manifest.baseNames());
  }

  @Override public Map<String, org.fedper.core.Tensor> getHead() {
    return pick(manifest.headNames());
  }

  @Override public double evaluate(LocalData.Batch batch) throws Exception {
    if (batch.size() == 0) {
      return Double.NaN;
    }
    syncFromModule();
    scorer.setWeights(current);
    int correct = 0;
    int pixels = batch.pixels.length / batch.size();
    for (int i = 0; i < batch.size(); i++) {
      float[] one = new float[pixels];
      System.arraycopy(batch.pixels, i * pixels, one, 0, pixels);
      if (OnnxScorer.argmax(scorer.logits(one)) == batch.labels[i]) {
        correct++;
      }
    }
    return (double) correct / batch.size();
  }
}
