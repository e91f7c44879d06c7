// API stub (signatures only) of androidx.activity.result.contract.ActivityResultContract.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/result/contract/ActivityResultContract.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Checked against: androidx/androidx:activity/activity/src/main/java/androidx/activity/result/contract/ActivityResultContract.kt (public abstract class ActivityResultContract<I, O>; its abstract members are omitted, the app does not subclass it)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity.result.contract;

public abstract class ActivityResultContract<I, O> {
  public ActivityResultContract() {
    throw new UnsupportedOperationException("stub");
  }
}
