// API stub (signatures only) of org.pytorch.executorch.Tensor.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/Tensor.java (org.pytorch:executorch-android 1.3.1 (pytorch/executorch tag v1.3.1)).
// Checked against: pytorch/executorch@v1.3.1 (e2f18eb23c45bd22ca332b0b8b49a81de304b472):extension/android/executorch_android/src/main/java/org/pytorch/executorch/Tensor.java
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

  public long[] shape() {
    throw new UnsupportedOperationException("stub");
  }

  public float[] getDataAsFloatArray() {
    throw new UnsupportedOperationException("stub");
  }
}
