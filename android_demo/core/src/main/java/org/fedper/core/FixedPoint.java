package org.fedper.core;

/**
 * A weighted, clipped base delta as uint32 words, as fedper/common/secagg/fixed_point.py
 * (docs/SECAGG.md, "The update as integers"): round-half-even(scale * w * delta) per coordinate,
 * w = min(num_samples, weight_cap) / weight_cap, then the capped weight as one more word; the
 * same words as Python's for the same doubles.
 */
public final class FixedPoint {
  public final double clip;
  public final int cohort;
  public final long weightCap;
  /** Words of 0/1 flags between the delta and the weight (DP: the unclipped bit). */
  public final int flags;

  public FixedPoint(double clip, int cohort, long weightCap) {
    this(clip, cohort, weightCap, 0);
  }

  public FixedPoint(double clip, int cohort, long weightCap, int flags) {
    if (!(clip > 0 && clip < Double.POSITIVE_INFINITY)) {
      throw new IllegalArgumentException("the clip must be a positive number, got " + clip);
    }
    if (cohort < 1 || cohort > (1 << 20)) {
      throw new IllegalArgumentException("the cohort must be 1 to 2^20 devices, got " + cohort);
    }
    if (weightCap < 1 || (long) cohort * weightCap >= (1L << 32)) {
      throw new IllegalArgumentException("the weight cap times the cohort must be below 2^32");
    }
    if (flags < 0) {
      throw new IllegalArgumentException("flags must be >= 0, got " + flags);
    }
    this.clip = clip;
    this.cohort = cohort;
    this.weightCap = weightCap;
    this.flags = flags;
  }

  /** The largest integer one device's coordinate can be. */
  public long bound() {
    return Integer.MAX_VALUE / cohort;
  }

  public double scale() {
    return (bound() - 1) / clip;
  }

  public long weight(long numSamples) {
    return Math.max(0, Math.min(numSamples, weightCap));
  }

  /** The words a device masks (int bits of uint32): its weighted delta, then its weight. */
  public int[] encode(double[] delta, long numSamples) {
    return encode(delta, numSamples, new int[0]);
  }

  /** The words with the flags (each 0 or 1, as many as this encoding has) before the weight. */
  public int[] encode(double[] delta, long numSamples, int[] flagValues) {
    if (flagValues.length != flags) {
      throw new IllegalArgumentException("expected " + flags + " flags, got " + flagValues.length);
    }
    long weight = weight(numSamples);
    double factor = scale() * weight / weightCap;
    long bound = bound();
    int[] words = new int[delta.length + flags + 1];
    for (int k = 0; k < delta.length; k++) {
      double scaled = Math.rint(delta[k] * factor);
      words[k] = (int) Math.max(-bound, Math.min(bound, (long) scaled));
    }
    for (int f = 0; f < flags; f++) {
      if (flagValues[f] != 0 && flagValues[f] != 1) {
        throw new IllegalArgumentException("a flag is 0 or 1, got " + flagValues[f]);
      }
      words[delta.length + f] = flagValues[f];
    }
    words[delta.length + flags] = (int) weight;
    return words;
  }
}
