// API stub (signatures only) of org.pytorch.executorch.EValue.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/EValue.java (org.pytorch:executorch-android 1.3.1 (pytorch/executorch tag v1.3.1)).
// Checked against: pytorch/executorch@v1.3.1 (e2f18eb23c45bd22ca332b0b8b49a81de304b472):extension/android/executorch_android/src/main/java/org/pytorch/executorch/EValue.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package org.pytorch.executorch;

public class EValue {
  private EValue() {}

  public static EValue from(Tensor tensor) {
    throw new UnsupportedOperationException("stub");
  }

  public Tensor toTensor() {
    throw new UnsupportedOperationException("stub");
  }
}
