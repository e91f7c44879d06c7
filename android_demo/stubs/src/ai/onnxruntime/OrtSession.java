// API stub (signatures only) of ai.onnxruntime.OrtSession.
// Mirrors java/src/main/java/ai/onnxruntime/OrtSession.java (onnxruntime v1.20.0, com.microsoft.onnxruntime:onnxruntime-android 1.20.0).
// Checked against: microsoft/onnxruntime:java/src/main/java/ai/onnxruntime/OrtSession.java as stored by the audit's code index
// (an undated 2023-copyright version, not the v1.20.0 tag: the repo snapshot is too large to fetch here).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package ai.onnxruntime;

import java.util.Map;
import java.util.Set;

public class OrtSession implements AutoCloseable {
  private OrtSession() {}

  public Set<String> getInputNames() {
    throw new UnsupportedOperationException("stub");
  }

  public Result run(Map<String, ? extends OnnxTensorLike> inputs) throws OrtException {
    throw new UnsupportedOperationException("stub");
  }

  @Override public void close() throws OrtException {
    throw new UnsupportedOperationException("stub");
  }

  public static class SessionOptions implements AutoCloseable {
    public SessionOptions() {
      throw new UnsupportedOperationException("stub");
    }

    @Override public void close() {
      throw new UnsupportedOperationException("stub");
    }
  }

  public static class Result implements AutoCloseable, Iterable<Map.Entry<String, OnnxValue>> {
    private Result() {}

    public OnnxValue get(int index) {
      throw new UnsupportedOperationException("stub");
    }

    @Override public void close() {
      throw new UnsupportedOperationException("stub");
    }

    @Override public java.util.Iterator<Map.Entry<String, OnnxValue>> iterator() {
      throw new UnsupportedOperationException("stub");
    }
  }
}
