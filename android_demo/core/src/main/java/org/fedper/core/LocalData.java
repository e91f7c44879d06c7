package org.fedper.core;

/** The user's own labelled examples (on Android: photos rated 1-5), split into train and test. */
public interface LocalData {
  /** Distinct training examples: what an upload reports as num_samples. */
  int trainSize();

  /** Training examples by index, as one batch. */
  Batch trainBatch(int[] indices);

  /** The local test split as one batch (may be empty). */
  Batch testSet();

  /** NCHW float pixels, normalized as the manifest says, and class labels. */
  final class Batch {
    public final float[] pixels;
    public final long[] labels;

    public Batch(float[] pixels, long[] labels) {
      this.pixels = pixels;
      this.labels = labels;
    }

    public int size() {
      return labels.length;
    }
  }
}
