package org.fedper.demo;

import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import java.io.IOException;
import java.nio.FloatBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fedper.core.Manifest;
import org.fedper.core.RuntimeVersions;
import org.fedper.core.ScoringFeeds;
import org.fedper.core.Tensor;

/**
 * Scores photos with the exported ONNX model and the device's current weights. The export makes
 * every base and head tensor a true graph input (no initializer of that name), because ONNX
 * Runtime's Java run() accepts only the model's required inputs; ScoringFeeds builds exactly those.
 * The caller closes the scorer (try-with-resources, or when replacing it).
 */
final class OnnxScorer implements Scorer {
  private final OrtEnvironment env;
  private final OrtSession.SessionOptions options;
  private final OrtSession session;
  private final Manifest manifest;

  OnnxScorer(Path model, Manifest manifest) throws IOException {
    RuntimeVersions.requireScorable(manifest.onnxOpset, BuildConfig.ONNXRUNTIME_VERSION);
    this.manifest = manifest;
    OrtSession.SessionOptions opts = null;
    try {
      this.env = OrtEnvironment.getEnvironment();
      opts = new OrtSession.SessionOptions();
      this.session = env.createSession(model.toString(), opts);
      this.options = opts; // ONNX Runtime: options must stay open until the session is closed
    } catch (OrtException ex) {
      if (opts != null) {
        opts.close();
      }
      throw new IOException("cannot load " + model + ": " + ex.getMessage(), ex);
    } catch (LinkageError err) {
      if (opts != null) {
        opts.close();
      }
      throw new IOException("ONNX Runtime's native library did not load (" + err + ")", err);
    }
  }

  @Override public float[] logits(float[] pixels, Map<String, Tensor> weights) throws OrtException {
    int s = manifest.inputSize;
    Map<String, Tensor> feeds = ScoringFeeds.feeds(
        manifest, session.getInputNames(), new Tensor(new long[] {1, 3, s, s}, pixels), weights);
    List<OnnxTensor> open = new ArrayList<>();
    try {
      Map<String, OnnxTensor> inputs = new LinkedHashMap<>();
      for (Map.Entry<String, Tensor> e : feeds.entrySet()) {
        OnnxTensor t = OnnxTensor.createTensor(env, FloatBuffer.wrap(e.getValue().data()), e.getValue().shape());
        open.add(t);
        inputs.put(e.getKey(), t);
      }
      try (OrtSession.Result r = session.run(inputs)) {
        return ((float[][]) r.get(0).getValue())[0];
      }
    } finally {
      for (OnnxTensor t : open) {
        t.close();
      }
    }
  }

  /**
   * The expected rating 1-5 under the model's softmax (classes are the ratings 1..5); for the ordinal
   * head, whose outputs are log-probabilities, the softmax is those probabilities.
   */
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

  @Override public void close() throws IOException {
    try {
      session.close();
    } catch (OrtException ex) {
      throw new IOException("closing the ONNX Runtime session: " + ex.getMessage(), ex);
    } finally {
      options.close();
    }
  }
}
