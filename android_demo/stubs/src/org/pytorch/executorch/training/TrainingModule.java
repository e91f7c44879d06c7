// API stub (signatures only) of org.pytorch.executorch.training.TrainingModule.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/training/TrainingModule.java (org.pytorch:executorch-android 1.3.1 (pytorch/executorch tag v1.3.1)).
// Checked against: pytorch/executorch@v1.3.1 (e2f18eb23c45bd22ca332b0b8b49a81de304b472):extension/android/executorch_android/src/main/java/org/pytorch/executorch/training/TrainingModule.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package org.pytorch.executorch.training;

import java.io.Closeable;
import java.util.Map;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Tensor;

public class TrainingModule implements Closeable {
  private TrainingModule() {}

  public static TrainingModule load(final String modelPath, final String dataPath) {
    throw new UnsupportedOperationException("stub");
  }

  public EValue[] executeForwardBackward(String methodName, EValue... inputs) {
    throw new UnsupportedOperationException("stub");
  }

  public Map<String, Tensor> namedParameters(String methodName) {
    throw new UnsupportedOperationException("stub");
  }

  public Map<String, Tensor> namedGradients(String methodName) {
    throw new UnsupportedOperationException("stub");
  }

  @Override public void close() {
    throw new UnsupportedOperationException("stub");
  }
}
