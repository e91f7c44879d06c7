// API stub (signatures only) of androidx.core.app.ComponentActivity.
// Mirrors androidx/core/core/src/main/java/androidx/core/app/ComponentActivity.java (androidx.core:core 1.13.0).
// Checked against: androidx/androidx@96a78b6508e901db42fac02da3c44474728e2392:core/core/src/main/java/androidx/core/app/ComponentActivity.java (public class ComponentActivity extends Activity; public no-arg constructor) - not opened, class shape from https://developer.android.com/reference/androidx/core/app/ComponentActivity
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.core.app;

public class ComponentActivity extends android.app.Activity {
  public ComponentActivity() {
    throw new UnsupportedOperationException("stub");
  }
}
