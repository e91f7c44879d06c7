// API stub (signatures only) of android.widget.ProgressBar.
// Mirrors frameworks/base/core/java/android/widget/ProgressBar.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/widget/ProgressBar (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class ProgressBar extends android.view.View {
  public ProgressBar(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }
}
