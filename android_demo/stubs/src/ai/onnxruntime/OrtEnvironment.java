// API stub (signatures only) of ai.onnxruntime.OrtEnvironment.
// Mirrors java/src/main/java/ai/onnxruntime/OrtEnvironment.java (onnxruntime v1.20.0 (com.microsoft.onnxruntime:onnxruntime-android 1.20.0); checked against microsoft/onnxruntime java/src/main/java/ai/onnxruntime/).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package ai.onnxruntime;

public final class OrtEnvironment implements AutoCloseable {
  private OrtEnvironment() {}

  public static synchronized OrtEnvironment getEnvironment() {
    throw new UnsupportedOperationException("stub");
  }

  public OrtSession createSession(String modelPath, OrtSession.SessionOptions options) throws OrtException {
    throw new UnsupportedOperationException("stub");
  }

  @Override public void close() throws OrtException {
    throw new UnsupportedOperationException("stub");
  }
}
