// API stub (signatures only) of ai.onnxruntime.OnnxTensor.
// Mirrors java/src/main/java/ai/onnxruntime/OnnxTensor.java (onnxruntime v1.20.0, com.microsoft.onnxruntime:onnxruntime-android 1.20.0).
// Checked against: microsoft/onnxruntime:java/src/main/java/ai/onnxruntime/OnnxTensor.java as stored by the audit's code index
// (an undated 2023-copyright version, not the v1.20.0 tag: the repo snapshot is too large to fetch here).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package ai.onnxruntime;

import java.nio.FloatBuffer;

public class OnnxTensor extends OnnxTensorLike {
  private OnnxTensor() {}

  public static OnnxTensor createTensor(OrtEnvironment env, FloatBuffer data, long[] shape) throws OrtException {
    throw new UnsupportedOperationException("stub");
  }

  @Override public Object getValue() throws OrtException {
    throw new UnsupportedOperationException("stub");
  }

  @Override public void close() {
    throw new UnsupportedOperationException("stub");
  }
}
