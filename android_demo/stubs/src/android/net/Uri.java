// API stub (signatures only) of android.net.Uri.
// Mirrors frameworks/base/core/java/android/net/Uri.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/net/Uri (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.net;

public abstract class Uri {
  @Override public abstract String toString();
}
