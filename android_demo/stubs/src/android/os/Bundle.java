// API stub (signatures only) of android.os.Bundle.
// Mirrors frameworks/base/core/java/android/os/Bundle.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/os/Bundle (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.os;

public final class Bundle {
  public Bundle() {
    throw new UnsupportedOperationException("stub");
  }
}
