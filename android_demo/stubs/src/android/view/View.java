// API stub (signatures only) of android.view.View.
// Mirrors frameworks/base/core/java/android/view/View.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/view/View (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.view;

public class View {
  public View(android.content.Context context) {
    throw new UnsupportedOperationException("stub");
  }

  public void setOnClickListener(OnClickListener l) {
    throw new UnsupportedOperationException("stub");
  }

  public interface OnClickListener {
    void onClick(View v);
  }
}
