// API stub (signatures only) of android.app.Activity.
// Mirrors frameworks/base/core/java/android/app/Activity.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/app/Activity (API 34); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.app;

import android.os.Bundle;
import android.view.View;

public class Activity extends android.view.ContextThemeWrapper {
  public Activity() {
    throw new UnsupportedOperationException("stub");
  }

  protected void onCreate(Bundle savedInstanceState) {
    throw new UnsupportedOperationException("stub");
  }

  protected void onDestroy() {
    throw new UnsupportedOperationException("stub");
  }

  public boolean isDestroyed() {
    throw new UnsupportedOperationException("stub");
  }

  public void setContentView(int layoutResID) {
    throw new UnsupportedOperationException("stub");
  }

  public <T extends View> T findViewById(int id) {
    throw new UnsupportedOperationException("stub");
  }

  public final void runOnUiThread(Runnable action) {
    throw new UnsupportedOperationException("stub");
  }
}
