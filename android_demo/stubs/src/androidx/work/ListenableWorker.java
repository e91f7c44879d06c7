// API stub (signatures only) of androidx.work.ListenableWorker.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/ListenableWorker.java (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@24607fc99a6ef61a5f2e2cc80cd395f0dbfcbe7e:work/work-runtime/src/main/java/androidx/work/ListenableWorker.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import android.content.Context;

public abstract class ListenableWorker {
  public ListenableWorker(Context appContext, WorkerParameters workerParams) {
    throw new UnsupportedOperationException("stub");
  }

  /** True once WorkManager stopped this worker (a constraint lost, the work cancelled or replaced). */
  public final boolean isStopped() {
    throw new UnsupportedOperationException("stub");
  }

  public final Context getApplicationContext() {
    throw new UnsupportedOperationException("stub");
  }

  public abstract static class Result {
    Result() {}

    public static Result success() {
      throw new UnsupportedOperationException("stub");
    }

    public static Result retry() {
      throw new UnsupportedOperationException("stub");
    }

    public static Result failure() {
      throw new UnsupportedOperationException("stub");
    }
  }
}
