// API stub (signatures only) of android.widget.Button.
// Mirrors frameworks/base/core/java/android/widget/Button.java (API 34 (compileSdk 34)).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class Button extends TextView {
  public Button(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }
}
