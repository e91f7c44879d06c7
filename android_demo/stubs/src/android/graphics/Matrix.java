// API stub (signatures only) of android.graphics.Matrix.
// Mirrors frameworks/base/graphics/java/android/graphics/Matrix.java (API 34 (compileSdk 34)).
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
