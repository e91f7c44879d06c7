// API stub (signatures only) of androidx.work.WorkRequest.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/WorkRequest.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx:work/work-runtime/src/main/java/androidx/work/WorkRequest.kt (stored version, code-index id 1104107748; Kotlin final fun setConstraints(): B, final fun build(): W)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public abstract class WorkRequest {
  WorkRequest() {}

  public abstract static class Builder<B extends Builder<B, ?>, W extends WorkRequest> {
    Builder() {}

    public final B setConstraints(Constraints constraints) {
      throw new UnsupportedOperationException("stub");
    }

    public final W build() {
      throw new UnsupportedOperationException("stub");
    }
  }
}
