// API stub (signatures only) of org.pytorch.executorch.training.SGD.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/training/SGD.java (org.pytorch:executorch-android 1.3.1 (pytorch/executorch tag v1.3.1)).
// Checked against: pytorch/executorch@v1.3.1 (e2f18eb23c45bd22ca332b0b8b49a81de304b472):extension/android/executorch_android/src/main/java/org/pytorch/executorch/training/SGD.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package org.pytorch.executorch.training;

import java.util.Map;
import org.pytorch.executorch.Tensor;

public class SGD {
  private SGD() {}

  public static SGD create(Map<String, Tensor> namedParameters, double learningRate, double momentum,
      double dampening, double weightDecay, boolean nesterov) {
    throw new UnsupportedOperationException("stub");
  }

  public void step(Map<String, Tensor> namedGradients) {
    throw new UnsupportedOperationException("stub");
  }
}
