// API stub (signatures only) of androidx.core.app.ComponentActivity.
// Mirrors androidx/core/core/src/main/java/androidx/core/app/ComponentActivity.java (androidx.core:core 1.13.0).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.core.app;

public class ComponentActivity extends android.app.Activity {
  public ComponentActivity() {
    throw new UnsupportedOperationException("stub");
  }
}
