// API stub (signatures only) of android.content.ContextWrapper.
// Mirrors frameworks/base/core/java/android/content/ContextWrapper.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/content/ContextWrapper (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.content;

import java.io.File;

public class ContextWrapper extends Context {
  public ContextWrapper(Context base) {
    throw new UnsupportedOperationException("stub");
  }

  @Override public File getFilesDir() {
    throw new UnsupportedOperationException("stub");
  }

  @Override public ContentResolver getContentResolver() {
    throw new UnsupportedOperationException("stub");
  }

  @Override public SharedPreferences getSharedPreferences(String name, int mode) {
    throw new UnsupportedOperationException("stub");
  }

  @Override public Context getApplicationContext() {
    throw new UnsupportedOperationException("stub");
  }
}
