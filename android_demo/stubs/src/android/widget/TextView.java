// API stub (signatures only) of android.widget.TextView.
// Mirrors frameworks/base/core/java/android/widget/TextView.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/widget/TextView (API 34); AOSP frameworks/base core/java/android/widget/TextView.java excerpt (@RemotableViewMethod public final void setText(CharSequence)); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class TextView extends android.view.View {
  public TextView(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }

  public final void setText(CharSequence text) {
    throw new UnsupportedOperationException("stub");
  }
}
