// API stub (signatures only) of android.content.Context.
// Mirrors frameworks/base/core/java/android/content/Context.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/content/Context (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.content;

import java.io.File;

public abstract class Context {
  public static final int MODE_PRIVATE = 0x0000;

  public abstract File getFilesDir();

  public abstract ContentResolver getContentResolver();

  public abstract SharedPreferences getSharedPreferences(String name, int mode);

  public abstract Context getApplicationContext();
}
