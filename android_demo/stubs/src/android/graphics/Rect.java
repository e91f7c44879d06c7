// API stub (signatures only) of android.graphics.Rect.
// Mirrors frameworks/base/graphics/java/android/graphics/Rect.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/graphics/Rect (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.graphics;

public final class Rect {
  public Rect() {
    throw new UnsupportedOperationException("stub");
  }
}
