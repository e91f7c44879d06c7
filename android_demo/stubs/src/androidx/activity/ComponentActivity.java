// API stub (signatures only) of androidx.activity.ComponentActivity.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/ComponentActivity.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Checked against: androidx.activity.ComponentActivity: public final <I, O> ActivityResultLauncher<I> registerForActivityResult(ActivityResultContract<I, O>, ActivityResultCallback<O>) as in decompiled activity 1.x classes in the code index; https://developer.android.com/reference/androidx/activity/ComponentActivity
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity;

import androidx.activity.result.ActivityResultCallback;
import androidx.activity.result.ActivityResultLauncher;
import androidx.activity.result.contract.ActivityResultContract;

public class ComponentActivity extends androidx.core.app.ComponentActivity {
  public ComponentActivity() {
    throw new UnsupportedOperationException("stub");
  }

  public final <I, O> ActivityResultLauncher<I> registerForActivityResult(
      ActivityResultContract<I, O> contract, ActivityResultCallback<O> callback) {
    throw new UnsupportedOperationException("stub");
  }
}
