// API stub (signatures only) of androidx.activity.result.contract.ActivityResultContracts.
// Mirrors androidx/activity/activity/src/main/java/androidx/activity/result/contract/ActivityResultContracts.kt (androidx.activity:activity 1.8.0 (pulled in by appcompat 1.7.0); Kotlin source, Java signature shown).
// Checked against: androidx/androidx:activity/activity/src/main/java/androidx/activity/result/contract/ActivityResultContracts.kt (open class GetContent : ActivityResultContract<String, Uri?>())
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.activity.result.contract;

public final class ActivityResultContracts {
  private ActivityResultContracts() {}

  public static class GetContent extends ActivityResultContract<String, android.net.Uri> {
    public GetContent() {
      throw new UnsupportedOperationException("stub");
    }
  }
}
