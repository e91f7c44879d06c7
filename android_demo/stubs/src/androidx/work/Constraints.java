// API stub (signatures only) of androidx.work.Constraints.
// Mirrors androidx/work/work-runtime/src/main/java/androidx/work/Constraints.kt (androidx.work:work-runtime 2.9.1).
// Checked against: androidx/androidx:work/work-runtime/src/main/java/androidx/work/Constraints.kt (stored version, code-index id 614062107, newer than 2.9.1)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.work;

public final class Constraints {
  private Constraints() {}

  public static final class Builder {
    public Builder() {
      throw new UnsupportedOperationException("stub");
    }

    public Builder setRequiresCharging(boolean requiresCharging) {
      throw new UnsupportedOperationException("stub");
    }

    /** API 23+. */
    public Builder setRequiresDeviceIdle(boolean requiresDeviceIdle) {
      throw new UnsupportedOperationException("stub");
    }

    public Builder setRequiresBatteryNotLow(boolean requiresBatteryNotLow) {
      throw new UnsupportedOperationException("stub");
    }

    public Builder setRequiredNetworkType(NetworkType networkType) {
      throw new UnsupportedOperationException("stub");
    }

    public Constraints build() {
      throw new UnsupportedOperationException("stub");
    }
  }
}
