// API stub (signatures only) of androidx.work.Operation.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/Operation.java (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx@aa889ef770884978462487563751d6041216faea:work/work-runtime/src/main/java/androidx/work/Operation.java (public interface; members unused)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public interface Operation {}
