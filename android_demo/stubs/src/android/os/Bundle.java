// API stub (signatures only) of android.os.Bundle.
// Mirrors frameworks/base/core/java/android/os/Bundle.java (API 34 (compileSdk 34)).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.os;

public final class Bundle {
  public Bundle() {
    throw new UnsupportedOperationException("stub");
  }
}
