// API stub (signatures only) of android.view.View.
// Mirrors frameworks/base/core/java/android/view/View.java (API 34 (compileSdk 34)).
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
