// API stub (signatures only) of android.graphics.Matrix.
// Mirrors frameworks/base/graphics/java/android/graphics/Matrix.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/graphics/Matrix (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.graphics;

public class Matrix {
  public Matrix() {
    throw new UnsupportedOperationException("stub");
  }

  public boolean postScale(float sx, float sy) {
    throw new UnsupportedOperationException("stub");
  }

  public boolean postRotate(float degrees) {
    throw new UnsupportedOperationException("stub");
  }
}
