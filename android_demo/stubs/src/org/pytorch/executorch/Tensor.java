// API stub (signatures only) of org.pytorch.executorch.Tensor, as Java sees the Kotlin source.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/Tensor.kt (org.pytorch:executorch-android 1.5.1).
// Checked against: pytorch/executorch@v1.4.1 and @cff6f4dd (main, 2026-08-22, version.txt 1.5.0), identical for this
// file; the v1.5.1 tag (3b606839) was not in the stored snapshot (see android_demo/README.md).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package org.pytorch.executorch;

public abstract class Tensor {
  Tensor() {}

  public static Tensor fromBlob(float[] data, long[] shape) {
    throw new UnsupportedOperationException("stub");
  }

  public static Tensor fromBlob(long[] data, long[] shape) {
    throw new UnsupportedOperationException("stub");
  }

  public final long[] shape() {
    throw new UnsupportedOperationException("stub");
  }

  public java.nio.Buffer getRawDataBuffer() {
    throw new UnsupportedOperationException("stub");
  }

  public float[] getDataAsFloatArray() {
    throw new UnsupportedOperationException("stub");
  }
}
