// API stub (signatures only) of androidx.work.NetworkType.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/NetworkType.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@31adf48a5ba261a6d7abf653f74a38d1623fd319:work/work-runtime/src/main/java/androidx/work/NetworkType.kt
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public enum NetworkType {
  NOT_REQUIRED,
  CONNECTED,
  UNMETERED,
  NOT_ROAMING,
  METERED,
  TEMPORARILY_UNMETERED
}
