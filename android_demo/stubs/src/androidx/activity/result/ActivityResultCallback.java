// API stub (signatures only) of androidx.activity.result.ActivityResultCallback.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/result/ActivityResultCallback.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Checked against: androidx/androidx@491d8c04881ad495b71e8b68600c86e46bb4ebad:activity/activity/src/main/java/androidx/activity/result/ActivityResultCallback.kt (fun interface, onActivityResult(result: O))
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity.result;

public interface ActivityResultCallback<O> {
  void onActivityResult(O result);
}
