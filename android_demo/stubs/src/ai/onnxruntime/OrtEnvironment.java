// API stub (signatures only) of ai.onnxruntime.OrtEnvironment.
// Mirrors java/src/main/java/ai/onnxruntime/OrtEnvironment.java (onnxruntime v1.20.0, com.microsoft.onnxruntime:onnxruntime-android 1.20.0).
// Checked against: microsoft/onnxruntime:java/src/main/java/ai/onnxruntime/OrtEnvironment.java as stored by the audit's code index
// (an undated 2023-copyright version, not the v1.20.0 tag: the repo snapshot is too large to fetch here).
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

  /** A no-op since ORT 1.11; declares no checked exception. */
  @Override public void close() {
    throw new UnsupportedOperationException("stub");
  }
}
