// API stub (signatures only) of org.pytorch.executorch.training.TrainingModule, as Java sees the Kotlin source.
// Mirrors extension/android/executorch_android/src/main/java/org/pytorch/executorch/training/TrainingModule.kt (org.pytorch:executorch-android 1.5.1).
// Checked against: pytorch/executorch@v1.4.1 and @cff6f4dd (main, 2026-08-22, version.txt 1.5.0), identical for this
// file; the v1.5.1 tag (3b606839) was not in the stored snapshot (see android_demo/README.md).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package org.pytorch.executorch.training;

import java.io.Closeable;
import java.util.Map;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Tensor;

public final class TrainingModule implements Closeable {
  private TrainingModule() {}

  public static TrainingModule load(String modelPath, String dataPath) {
    throw new UnsupportedOperationException("stub");
  }

  public static TrainingModule load(String modelPath) {
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
