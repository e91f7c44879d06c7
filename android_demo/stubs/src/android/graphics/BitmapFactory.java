// API stub (signatures only) of android.graphics.BitmapFactory.
// Mirrors frameworks/base/graphics/java/android/graphics/BitmapFactory.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/graphics/BitmapFactory (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.graphics;

import java.io.InputStream;

public class BitmapFactory {
  public BitmapFactory() {
    throw new UnsupportedOperationException("stub");
  }

  public static class Options {
    public boolean inJustDecodeBounds;
    public int inSampleSize;
    public int outWidth;
    public int outHeight;

    public Options() {
      throw new UnsupportedOperationException("stub");
    }
  }

  public static Bitmap decodeFile(String pathName) {
    throw new UnsupportedOperationException("stub");
  }

  public static Bitmap decodeStream(InputStream is, Rect outPadding, Options opts) {
    throw new UnsupportedOperationException("stub");
  }
}
