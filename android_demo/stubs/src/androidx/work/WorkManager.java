// API stub (signatures only) of androidx.work.WorkManager.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/WorkManager.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@3a8d8cafdfd106387ab50a51c4f67a0977099e71:work/work-runtime/src/main/java/androidx/work/WorkManager.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import android.content.Context;

public abstract class WorkManager {
  WorkManager() {}

  /** A Kotlin companion @JvmStatic member. */
  public static WorkManager getInstance(Context context) {
    throw new UnsupportedOperationException("stub");
  }

  /** Concrete upstream (delegates to the List overload), not abstract. */
  public Operation enqueueUniqueWork(String uniqueWorkName, ExistingWorkPolicy existingWorkPolicy, OneTimeWorkRequest work) {
    throw new UnsupportedOperationException("stub");
  }

  public abstract Operation cancelUniqueWork(String uniqueWorkName);

  public abstract Operation enqueueUniquePeriodicWork(
      String uniqueWorkName, ExistingPeriodicWorkPolicy existingPeriodicWorkPolicy, PeriodicWorkRequest periodicWork);
}
