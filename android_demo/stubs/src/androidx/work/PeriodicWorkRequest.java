// API stub (signatures only) of androidx.work.PeriodicWorkRequest.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/PeriodicWorkRequest.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx:work/work-runtime/src/main/java/androidx/work/PeriodicWorkRequest.kt (stored version, code-index id 504386956; Builder(Class<out ListenableWorker?>, Long, TimeUnit))
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import java.util.concurrent.TimeUnit;

public final class PeriodicWorkRequest extends WorkRequest {
  private PeriodicWorkRequest() {}

  public static final class Builder extends WorkRequest.Builder<Builder, PeriodicWorkRequest> {
    public Builder(Class<? extends ListenableWorker> workerClass, long repeatInterval, TimeUnit repeatIntervalTimeUnit) {
      throw new UnsupportedOperationException("stub");
    }
  }
}
