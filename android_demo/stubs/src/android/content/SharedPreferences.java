// API stub (signatures only) of android.content.SharedPreferences.
// Mirrors frameworks/base/core/java/android/content/SharedPreferences.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/content/SharedPreferences (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.content;

public interface SharedPreferences {
  String getString(String key, String defValue);

  Editor edit();

  interface Editor {
    Editor putString(String key, String value);

    void apply();
  }
}
