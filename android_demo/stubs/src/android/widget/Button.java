// API stub (signatures only) of android.widget.Button.
// Mirrors frameworks/base/core/java/android/widget/Button.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/widget/Button (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class Button extends TextView {
  public Button(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }
}
