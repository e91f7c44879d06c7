// API stub (signatures only) of ai.onnxruntime.OnnxTensor.
// Mirrors java/src/main/java/ai/onnxruntime/OnnxTensor.java (onnxruntime v1.20.0 (com.microsoft.onnxruntime:onnxruntime-android 1.20.0); checked against microsoft/onnxruntime java/src/main/java/ai/onnxruntime/).
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
