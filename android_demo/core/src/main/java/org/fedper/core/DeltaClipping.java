package org.fedper.core;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The base delta clipped to the task's clip_norm, as docs/PROTOCOL.md, "Clipping the base delta"
 * (revision 1.5), defines it to the bit: the Python device (fedper/common/dp/clipping.py) gives
 * the same float32 tensors from the same inputs (host test), and the server measures what
 * arrives with the same norm, so a device that clips here is never refused for its clipping.
 */
public final class DeltaClipping {
  /** Tries after the exact scale: margins 2^-23, 2^-22, ..., 2^-1, then 1 (scale 0). */
  public static final int MARGIN_STEPS = 24;

  private DeltaClipping() {}

  /** What is uploaded, and whether the delta was within the clip before clipping. */
  public static final class Clipped {
    public final Map<String, Tensor> tensors;
    public final double norm;
    public final boolean unclipped;
    public final double scale;

    Clipped(Map<String, Tensor> tensors, double norm, boolean unclipped, double scale) {
      this.tensors = tensors;
      this.norm = norm;
      this.unclipped = unclipped;
      this.scale = scale;
    }
  }

  /**
   * The L2 norm of x - base over names: each element widened to double, subtracted, squared and
   * added to one running sum, tensor by tensor in names' order, element by element; then sqrt.
   */
  public static double distance(Map<String, Tensor> x, Map<String, Tensor> base, List<String> names) {
    double sum = 0.0;
    for (String name : names) {
      float[] a = values(x, name);
      float[] b = values(base, name);
      if (a.length != b.length) {
        throw new IllegalArgumentException(
            "tensor " + name + " has " + a.length + " values, its base " + b.length);
      }
      for (int k = 0; k < a.length; k++) {
        double d = (double) a[k] - (double) b[k];
        sum = sum + d * d;
      }
    }
    return Math.sqrt(sum);
  }

  /** trained, with its delta from received clipped to L2 norm bound (see the class comment). */
  public static Clipped clip(
      Map<String, Tensor> trained, Map<String, Tensor> received, List<String> names, double bound) {
    if (!(bound > 0 && bound < Double.POSITIVE_INFINITY)) {
      throw new IllegalArgumentException("the clip norm must be a finite number > 0, got " + bound);
    }
    double norm = distance(trained, received, names);
    if (!Double.isFinite(norm)) {
      throw new IllegalArgumentException(
          "the trained base has a non-finite value, or its distance from the received one overflows");
    }
    if (norm <= bound) {
      Map<String, Tensor> same = new LinkedHashMap<>();
      for (String name : names) {
        same.put(name, trained.get(name));
      }
      return new Clipped(same, norm, true, 1.0);
    }
    for (int step = 0; step <= MARGIN_STEPS; step++) {
      double margin = step == 0 ? 0.0 : Math.scalb(1.0, step - MARGIN_STEPS);
      double scale = (bound / norm) * (1.0 - margin);
      Map<String, Tensor> out = new LinkedHashMap<>();
      for (String name : names) {
        float[] t = values(trained, name);
        float[] r = values(received, name);
        float[] u = new float[t.length];
        for (int k = 0; k < t.length; k++) {
          double rk = r[k];
          u[k] = (float) (rk + scale * ((double) t[k] - rk));
        }
        out.put(name, new Tensor(received.get(name).shape(), u));
      }
      if (distance(out, received, names) <= bound) {
        return new Clipped(out, norm, false, scale);
      }
    }
    throw new AssertionError("unreachable: scale 0 gives the received base, at distance 0");
  }

  private static float[] values(Map<String, Tensor> tensors, String name) {
    Tensor t = tensors.get(name);
    if (t == null) {
      throw new IllegalArgumentException("no tensor " + name);
    }
    return t.data();
  }
}
