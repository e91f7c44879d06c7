// API stub (signatures only) of androidx.fragment.app.FragmentActivity.
// Mirrors androidx/fragment/fragment/src/main/java/androidx/fragment/app/FragmentActivity.java (androidx.fragment:fragment 1.5.4 (pulled in by appcompat 1.7.0)).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.fragment.app;

public class FragmentActivity extends androidx.activity.ComponentActivity {
  public FragmentActivity() {
    throw new UnsupportedOperationException("stub");
  }
}
