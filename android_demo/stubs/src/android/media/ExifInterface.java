// API stub (signatures only) of android.media.ExifInterface.
// Mirrors frameworks/base/media/java/android/media/ExifInterface.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/media/ExifInterface (API 34); developer.android.com/sdk/api_diff/30/changes/android.media.ExifInterface (API 30 added only the (InputStream, int) overload; (InputStream) throws IOException since API 24); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.media;

import java.io.IOException;
import java.io.InputStream;

public class ExifInterface {
  public static final String TAG_ORIENTATION = "Orientation";
  public static final int ORIENTATION_NORMAL = 1;
  public static final int ORIENTATION_FLIP_VERTICAL = 4;
  public static final int ORIENTATION_ROTATE_180 = 3;
  public static final int ORIENTATION_TRANSPOSE = 5;
  public static final int ORIENTATION_ROTATE_90 = 6;
  public static final int ORIENTATION_TRANSVERSE = 7;
  public static final int ORIENTATION_ROTATE_270 = 8;

  /** API 24+. */
  public ExifInterface(InputStream inputStream) throws IOException {
    throw new UnsupportedOperationException("stub");
  }

  public int getAttributeInt(String tag, int defaultValue) {
    throw new UnsupportedOperationException("stub");
  }
}
