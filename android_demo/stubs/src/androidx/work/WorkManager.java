// API stub (signatures only) of androidx.work.WorkManager.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/WorkManager.kt (androidx.work:work-runtime 2.9.1).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import android.content.Context;

public abstract class WorkManager {
  WorkManager() {}

  /** A Kotlin companion @JvmStatic member. */
  public static WorkManager getInstance(Context context) {
    throw new UnsupportedOperationException("stub");
  }

  public abstract Operation enqueueUniqueWork(String uniqueWorkName, ExistingWorkPolicy existingWorkPolicy, OneTimeWorkRequest work);

  public abstract Operation enqueueUniquePeriodicWork(
      String uniqueWorkName, ExistingPeriodicWorkPolicy existingPeriodicWorkPolicy, PeriodicWorkRequest periodicWork);
}
