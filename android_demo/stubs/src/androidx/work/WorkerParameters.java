// API stub (signatures only) of androidx.work.WorkerParameters.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/WorkerParameters.java (androidx.work:work-runtime 2.9.1).
// Checked against: decompiled work-runtime WorkerParameters (public final class) in the code index; source not read (members unused)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public final class WorkerParameters {
  private WorkerParameters() {}
}
