// API stub (signatures only) of androidx.activity.result.ActivityResultCallback.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/result/ActivityResultCallback.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity.result;

public interface ActivityResultCallback<O> {
  void onActivityResult(O result);
}
