// API stub (signatures only) of androidx.fragment.app.FragmentActivity.
// Mirrors androidx/fragment/fragment/src/main/java/androidx/fragment/app/FragmentActivity.java (androidx.fragment:fragment 1.5.4 (pulled in by appcompat 1.7.0)).
// Checked against: androidx/androidx@32d82ea7206dfde4168b3344016f5a8229c13e78:fragment/fragment/src/main/java/androidx/fragment/app/FragmentActivity.java (extends androidx.activity.ComponentActivity) - not opened, class shape from https://developer.android.com/reference/androidx/fragment/app/FragmentActivity
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.fragment.app;

public class FragmentActivity extends androidx.activity.ComponentActivity {
  public FragmentActivity() {
    throw new UnsupportedOperationException("stub");
  }
}
