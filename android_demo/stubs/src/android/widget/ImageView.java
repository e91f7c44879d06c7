// API stub (signatures only) of android.widget.ImageView.
// Mirrors frameworks/base/core/java/android/widget/ImageView.java (API 34 (compileSdk 34)).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.widget;

public class ImageView extends android.view.View {
  public ImageView(android.content.Context context) {
    super(context);
    throw new UnsupportedOperationException("stub");
  }

  public void setImageURI(android.net.Uri uri) {
    throw new UnsupportedOperationException("stub");
  }
}
