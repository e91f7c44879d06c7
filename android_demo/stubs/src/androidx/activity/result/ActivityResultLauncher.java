// API stub (signatures only) of androidx.activity.result.ActivityResultLauncher.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/result/ActivityResultLauncher.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Checked against: androidx/androidx@7f2939474598278d9ac3d9ed72251cf66b5014a4:activity/activity/src/main/java/androidx/activity/result/ActivityResultLauncher.kt (open fun launch(input: I))
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity.result;

public abstract class ActivityResultLauncher<I> {
  public ActivityResultLauncher() {
    throw new UnsupportedOperationException("stub");
  }

  public void launch(I input) {
    throw new UnsupportedOperationException("stub");
  }
}
