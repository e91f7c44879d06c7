package org.fedper.core;

import java.util.Arrays;

/** A float32 tensor: a shape and row-major values. Every tensor on the wire is floating point. */
public final class Tensor {
  private final long[] shape;
  private final float[] data;

  public Tensor(long[] shape, float[] data) {
    long n = numel(shape);
    if (n != data.length) {
      throw new IllegalArgumentException(
          "shape " + Arrays.toString(shape) + " needs " + n + " values, got " + data.length);
    }
    this.shape = shape.clone();
    this.data = data;
  }

  public static Tensor filled(long[] shape, float value) {
    float[] data = new float[(int) numel(shape)];
    Arrays.fill(data, value);
    return new Tensor(shape, data);
  }

  public static long numel(long[] shape) {
    long n = 1;
    for (long d : shape) {
      if (d < 0) {
        throw new IllegalArgumentException("negative dimension in " + Arrays.toString(shape));
      }
      n *= d;
    }
    return n;
  }

  public long[] shape() {
    return shape.clone();
  }

  /** The values themselves (not a copy): callers that keep a tensor must not change them. */
  public float[] data() {
    return data;
  }

  public int size() {
    return data.length;
  }

  public Tensor plus(float value) {
    float[] out = data.clone();
    for (int k = 0; k < out.length; k++) {
      out[k] += value;
    }
    return new Tensor(shape, out);
  }

  @Override
  public boolean equals(Object other) {
    if (!(other instanceof Tensor)) {
      return false;
    }
    Tensor t = (Tensor) other;
    return Arrays.equals(shape, t.shape) && Arrays.equals(data, t.data);
  }

  @Override
  public int hashCode() {
    return 31 * Arrays.hashCode(shape) + Arrays.hashCode(data);
  }

  @Override
  public String toString() {
    return "Tensor" + Arrays.toString(shape);
  }
}
