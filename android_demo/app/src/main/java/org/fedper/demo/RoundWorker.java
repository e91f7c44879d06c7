package org.fedper.demo;

import android.content.Context;
import android.content.SharedPreferences;
import androidx.annotation.NonNull;
import androidx.work.Constraints;
import androidx.work.ExistingPeriodicWorkPolicy;
import androidx.work.NetworkType;
import androidx.work.OneTimeWorkRequest;
import androidx.work.PeriodicWorkRequest;
import androidx.work.WorkManager;
import androidx.work.Worker;
import androidx.work.WorkerParameters;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.fedper.core.DeviceStore;
import org.fedper.core.ProtocolClient;
import org.fedper.core.ProtocolException;
import org.fedper.core.RoundLoop;

/**
 * One federated round in the background, only when the phone is charging, idle and on an
 * unmetered network (as production FL systems schedule training), so the user never pays for it.
 */
public final class RoundWorker extends Worker {
  static final String UNIQUE = "fedper-round";
  static final String PREFS = "fedper-status";

  public RoundWorker(@NonNull Context context, @NonNull WorkerParameters params) {
    super(context, params);
  }

  /** Every few hours when the constraints hold; WorkManager keeps the schedule across reboots. */
  static void schedule(Context context) {
    Constraints constraints = new Constraints.Builder()
        .setRequiresCharging(true)
        .setRequiresDeviceIdle(true)
        .setRequiredNetworkType(NetworkType.UNMETERED)
        .build();
    PeriodicWorkRequest request = new PeriodicWorkRequest.Builder(RoundWorker.class, 3, TimeUnit.HOURS)
        .setConstraints(constraints)
        .build();
    WorkManager.getInstance(context).enqueueUniquePeriodicWork(UNIQUE, ExistingPeriodicWorkPolicy.KEEP, request);
  }

  /** The "take part now" button: no constraints, for trying the app out. */
  static void runNow(Context context) {
    WorkManager.getInstance(context).enqueue(new OneTimeWorkRequest.Builder(RoundWorker.class).build());
  }

  static DeviceStore store(Context context) {
    Path root = context.getFilesDir().toPath().resolve("fedper");
    return new DeviceStore(root);
  }

  @NonNull @Override
  public Result doWork() {
    Context context = getApplicationContext();
    SharedPreferences status = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE);
    try {
      RoundLoop loop = new RoundLoop(
          new ProtocolClient(BuildConfig.SERVER_URL),
          store(context),
          manifest -> {
            try {
              return PhotoRatings.load(context, manifest);
            } catch (java.io.IOException ex) {
              throw new java.io.UncheckedIOException(ex);
            }
          },
          ExecuTorchTrainer::new,
          seconds -> Thread.sleep((long) (seconds * 1000)),
          60.0,
          System.nanoTime());
      loop.ensureEnrolled(BuildConfig.ENROLLMENT_KEY, "android");
      List<RoundLoop.Report> done = loop.run(1);
      if (done.isEmpty()) {
        status.edit().putString("last", "the run is finished").apply();
      } else {
        RoundLoop.Report r = done.get(0);
        status.edit().putString("last", String.format(java.util.Locale.ROOT,
            "round %d: accuracy %.2f before, %.2f after training on %d photos",
            r.round, r.accuracy, r.accuracyAfter, r.numSamples)).apply();
      }
      return Result.success();
    } catch (ProtocolException.Transient ex) {
      status.edit().putString("last", "network trouble; will retry").apply();
      return Result.retry();
    } catch (Exception ex) {
      status.edit().putString("last", "round failed: " + ex.getMessage()).apply();
      return Result.failure();
    }
  }
}
