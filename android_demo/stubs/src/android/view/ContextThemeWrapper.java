// API stub (signatures only) of android.view.ContextThemeWrapper.
// Mirrors frameworks/base/core/java/android/view/ContextThemeWrapper.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/view/ContextThemeWrapper (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.view;

public class ContextThemeWrapper extends android.content.ContextWrapper {
  public ContextThemeWrapper() {
    super(null);
    throw new UnsupportedOperationException("stub");
  }
}
