package org.fedper.demo;

import java.io.IOException;
import java.util.Map;
import org.fedper.core.Tensor;

/**
 * What evaluation asks of an inference engine: one photo's logits under given weights. On the
 * phone, ONNX Runtime (OnnxScorer); the trainer opens one only when it has photos to score.
 */
public interface Scorer extends AutoCloseable {
  /** Logits for one normalized NCHW image under these base + head weights. */
  float[] logits(float[] pixels, Map<String, Tensor> weights) throws Exception;

  /** Releases the engine's native memory. */
  @Override void close() throws IOException;

  /** Opens the scorer of a round's export (the trainer calls it at most once). */
  interface Opener {
    Scorer open() throws IOException;
  }
}
