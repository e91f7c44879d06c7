// API stub (signatures only) of androidx.work.ExistingPeriodicWorkPolicy.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/ExistingPeriodicWorkPolicy.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@175c58024560b399159edf86fd676b30c75566e6:work/work-runtime/src/main/java/androidx/work/ExistingPeriodicWorkPolicy.kt
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public enum ExistingPeriodicWorkPolicy {
  @Deprecated REPLACE,
  KEEP,
  UPDATE,
  CANCEL_AND_REENQUEUE
}
