// API stub (signatures only) of android.widget.AbsSeekBar.
// Mirrors frameworks/base/core/java/android/widget/AbsSeekBar.java (API 34 (compileSdk 34)).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public abstract class AbsSeekBar extends ProgressBar {
  public AbsSeekBar(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }
}
