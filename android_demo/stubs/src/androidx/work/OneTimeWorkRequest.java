// API stub (signatures only) of androidx.work.OneTimeWorkRequest.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/OneTimeWorkRequest.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx:work/work-runtime/src/main/java/androidx/work/OneTimeWorkRequest.kt (stored version, code-index id 3487118644; final class Builder(Class<out ListenableWorker>) : WorkRequest.Builder<Builder, OneTimeWorkRequest>)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public final class OneTimeWorkRequest extends WorkRequest {
  private OneTimeWorkRequest() {}

  public static final class Builder extends WorkRequest.Builder<Builder, OneTimeWorkRequest> {
    public Builder(Class<? extends ListenableWorker> workerClass) {
      throw new UnsupportedOperationException("stub");
    }
  }
}
