// API stub (signatures only) of androidx.work.ExistingWorkPolicy.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/ExistingWorkPolicy.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@6ff110c6f6a7635ab89a7b73cf9be721567da20e:work/work-runtime/src/main/java/androidx/work/ExistingWorkPolicy.kt
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public enum ExistingWorkPolicy {
  REPLACE,
  KEEP,
  APPEND,
  APPEND_OR_REPLACE
}
