// API stub (signatures only) of androidx.work.Worker.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/Worker.java (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx:work/work-runtime/src/main/java/androidx/work/Worker.java @46771da284c79d77e6e969956da27ebd33d44c23
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

import android.content.Context;

public abstract class Worker extends ListenableWorker {
  public Worker(Context context, WorkerParameters workerParams) {
    super(context, workerParams);
  }

  public abstract Result doWork();
}
