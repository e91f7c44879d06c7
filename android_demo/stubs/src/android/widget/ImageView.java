// API stub (signatures only) of android.widget.ImageView.
// Mirrors frameworks/base/core/java/android/widget/ImageView.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/widget/ImageView (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class ImageView extends android.view.View {
  public ImageView(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }

  public void setImageBitmap(android.graphics.Bitmap bm) {
    throw new UnsupportedOperationException("stub");
  }
}
