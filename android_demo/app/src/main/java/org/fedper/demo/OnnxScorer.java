package org.fedper.demo;

import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import java.nio.FloatBuffer;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import org.fedper.core.Manifest;
import org.fedper.core.Tensor;

/**
 * Scores one photo with the exported ONNX model and the device's current weights: the export keeps
 * every weight as an overridable graph input, so the server's base plus this phone's own head are
 * fed in with the image and nothing is re-exported on the phone.
 */
final class OnnxScorer implements AutoCloseable {
  private final OrtEnvironment env = OrtEnvironment.getEnvironment();
  private final OrtSession session;
  private final Manifest manifest;
  private final String inputName;
  private final Map<String, OnnxTensor> weights = new HashMap<>();

  OnnxScorer(Path model, Manifest manifest) throws java.io.IOException {
    this.manifest = manifest;
    try {
      this.session = env.createSession(model.toString(), new OrtSession.SessionOptions());
      String image = null;
      for (String name : session.getInputNames()) {
        if (!manifest.base.containsKey(name) && !manifest.head.containsKey(name)) {
          image = name; // every other input is an overridable weight
          break;
        }
      }
      if (image == null) {
        throw new java.io.IOException(model + " has no image input");
      }
      this.inputName = image;
    } catch (OrtException ex) {
      throw new java.io.IOException("cannot load " + model + ": " + ex.getMessage(), ex);
    }
  }

  void setWeights(Map<String, Tensor> tensors) throws OrtException {
    for (OnnxTensor t : weights.values()) {
      t.close();
    }
    weights.clear();
    for (Map.Entry<String, Tensor> e : tensors.entrySet()) {
      weights.put(e.getKey(), OnnxTensor.createTensor(env, FloatBuffer.wrap(e.getValue().data()), e.getValue().shape()));
    }
  }

  /** Logits for one normalized NCHW image. */
  float[] logits(float[] pixels) throws OrtException {
    int s = manifest.inputSize;
    try (OnnxTensor x = OnnxTensor.createTensor(env, FloatBuffer.wrap(pixels), new long[] {1, 3, s, s})) {
      Map<String, OnnxTensor> feeds = new HashMap<>(weights);
      feeds.put(inputName, x);
      try (OrtSession.Result r = session.run(feeds)) {
        return ((float[][]) r.get(0).getValue())[0];
      }
    }
  }

  /** The expected rating 1-5 under the model's softmax (classes are the ratings 1..5). */
  static double expectedRating(float[] logits) {
    double max = Double.NEGATIVE_INFINITY;
    for (float v : logits) {
      max = Math.max(max, v);
    }
    double sum = 0;
    double weighted = 0;
    for (int k = 0; k < logits.length; k++) {
      double p = Math.exp(logits[k] - max);
      sum += p;
      weighted += p * (k + 1);
    }
    return weighted / sum;
  }

  static int argmax(float[] v) {
    int best = 0;
    for (int k = 1; k < v.length; k++) {
      if (v[k] > v[best]) {
        best = k;
      }
    }
    return best;
  }

  @Override public void close() throws OrtException {
    for (OnnxTensor t : weights.values()) {
      t.close();
    }
    session.close();
  }
}
