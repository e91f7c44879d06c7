// API stub (signatures only) of android.widget.TextView.
// Mirrors frameworks/base/core/java/android/widget/TextView.java (API 34 (compileSdk 34)).
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
