// API stub (signatures only) of android.graphics.Bitmap.
// Mirrors frameworks/base/graphics/java/android/graphics/Bitmap.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/graphics/Bitmap (API 34); AOSP graphics/java/android/graphics/Bitmap.java signatures as quoted in the code index (createBitmap(Bitmap,int,int,int,int,Matrix,boolean)); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.graphics;

import java.io.OutputStream;

public final class Bitmap {
  private Bitmap() {}

  public enum CompressFormat {
    JPEG
  }

  public int getWidth() {
    throw new UnsupportedOperationException("stub");
  }

  public int getHeight() {
    throw new UnsupportedOperationException("stub");
  }

  public void recycle() {
    throw new UnsupportedOperationException("stub");
  }

  public boolean compress(CompressFormat format, int quality, OutputStream stream) {
    throw new UnsupportedOperationException("stub");
  }

  public void getPixels(int[] pixels, int offset, int stride, int x, int y, int width, int height) {
    throw new UnsupportedOperationException("stub");
  }

  public static Bitmap createBitmap(Bitmap source, int x, int y, int width, int height) {
    throw new UnsupportedOperationException("stub");
  }

  public static Bitmap createBitmap(Bitmap source, int x, int y, int width, int height, Matrix m, boolean filter) {
    throw new UnsupportedOperationException("stub");
  }

  public static Bitmap createScaledBitmap(Bitmap src, int dstWidth, int dstHeight, boolean filter) {
    throw new UnsupportedOperationException("stub");
  }
}
