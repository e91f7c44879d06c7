// API stub (signatures only) of androidx.work.Worker.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/Worker.java (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@(stored Worker.java, e.g. id 1256460848):work/work-runtime/src/main/java/androidx/work/Worker.java
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import android.content.Context;

public abstract class Worker extends ListenableWorker {
  public Worker(Context context, WorkerParameters workerParams) {
    super(context, workerParams);
  }

  public abstract Result doWork();
}
