// API stub (signatures only) of android.widget.RatingBar.
// Mirrors frameworks/base/core/java/android/widget/RatingBar.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/widget/RatingBar (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class RatingBar extends AbsSeekBar {
  public RatingBar(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }

  public float getRating() {
    throw new UnsupportedOperationException("stub");
  }
}
