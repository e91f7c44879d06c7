// The host JVM's stand-in for android.util.Log: ExecuTorch's Tensor.kt logs through it on one
// error path (an unsupported dtype). Android has the real class; only build.sh compiles this.
package android.util;

public final class Log {
  private Log() {}

  public static int e(String tag, String msg) {
    System.err.println("E/" + tag + ": " + msg);
    return 0;
  }
}
