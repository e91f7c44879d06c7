package org.fedper.demo;

import android.content.Context;
import android.content.SharedPreferences;
import androidx.annotation.NonNull;
import androidx.work.Constraints;
import androidx.work.ExistingPeriodicWorkPolicy;
import androidx.work.ExistingWorkPolicy;
import androidx.work.NetworkType;
import androidx.work.OneTimeWorkRequest;
import androidx.work.PeriodicWorkRequest;
import androidx.work.WorkManager;
import androidx.work.Worker;
import androidx.work.WorkerParameters;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import org.fedper.core.DeviceStore;
import org.fedper.core.ProtocolClient;
import org.fedper.core.ProtocolException;
import org.fedper.core.RoundLoop;

/**
 * One federated round in the background, only when the phone is charging, idle and on an
 * unmetered network (as production FL systems schedule training), so the user never pays for it.
 * A round never runs beside another one (they would share round.ptd and the head store), and it
 * gives up waiting for a task well before WorkManager stops a worker (10 minutes).
 */
public final class RoundWorker extends Worker {
  static final String UNIQUE = "fedper-round";
  static final String UNIQUE_NOW = "fedper-round-now";
  static final String PREFS = "fedper-status";
  /** Total seconds a round may sleep on 204 / Retry-After before handing back to WorkManager. */
  static final double WAIT_BUDGET_SECONDS = 240;
  /** Periodic and one-time workers run in this process: one round at a time across both. */
  private static final ReentrantLock ROUND = new ReentrantLock();

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

  /**
   * The "take part now" button, as unique work (repeated taps queue one round, not many). It cannot
   * share the periodic job's unique name: that job is always enqueued, so KEEP would drop every tap
   * and REPLACE would cancel the schedule without stopping a round already running; the ROUND lock
   * keeps the two from running at once.
   */
  static void runNow(Context context) {
    WorkManager.getInstance(context).enqueueUniqueWork(
        UNIQUE_NOW, ExistingWorkPolicy.KEEP, new OneTimeWorkRequest.Builder(RoundWorker.class).build());
  }

  static DeviceStore store(Context context) {
    Path root = context.getFilesDir().toPath().resolve("fedper");
    return new DeviceStore(root);
  }

  /** Raised by the sleeper (which may throw only unchecked) when the wait budget is spent. */
  static final class WaitedTooLong extends RuntimeException {
    private static final long serialVersionUID = 1L;

    WaitedTooLong(double seconds) {
      super(String.format(Locale.ROOT, "no task after %.0f s of waiting", seconds));
    }
  }

  @NonNull @Override
  public Result doWork() {
    Context context = getApplicationContext();
    SharedPreferences status = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE);
    if (!ROUND.tryLock()) {
      return Result.retry(); // the other job is in a round right now
    }
    List<ExecuTorchTrainer> trainers = new ArrayList<>();
    double[] waited = {0};
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
          (dir, manifest) -> {
            ExecuTorchTrainer t = new ExecuTorchTrainer(dir, manifest);
            trainers.add(t);
            return t;
          },
          seconds -> {
            if (waited[0] + seconds > WAIT_BUDGET_SECONDS) {
              throw new WaitedTooLong(waited[0]);
            }
            waited[0] += seconds;
            Thread.sleep((long) (seconds * 1000));
          },
          60.0,
          System.nanoTime());
      loop.ensureEnrolled(BuildConfig.ENROLLMENT_KEY, "android");
      List<RoundLoop.Report> done = loop.run(1);
      if (done.isEmpty()) {
        status.edit().putString("last", "the run is finished").apply();
      } else {
        RoundLoop.Report r = done.get(0);
        status.edit().putString("last", String.format(Locale.ROOT,
            "round %d: accuracy %s before, %s after training on %d photos",
            r.round, accuracy(r.accuracy), accuracy(r.accuracyAfter), r.numSamples)).apply();
      }
      return Result.success();
    } catch (WaitedTooLong ex) {
      status.edit().putString("last", ex.getMessage() + "; will try again later").apply();
      return Result.retry();
    } catch (ProtocolException.Transient ex) {
      status.edit().putString("last", "network trouble; will retry").apply();
      return Result.retry();
    } catch (Exception | LinkageError ex) {
      status.edit().putString("last", "round failed: " + ex.getMessage()).apply();
      return Result.failure();
    } finally {
      for (ExecuTorchTrainer t : trainers) {
        try {
          t.close();
        } catch (Exception ignored) {
          // closing releases native memory; a failure here changes nothing about the round
        }
      }
      ROUND.unlock();
    }
  }

  private static String accuracy(double a) {
    return Double.isFinite(a) ? String.format(Locale.ROOT, "%.2f", a) : "n/a (no test photos)";
  }
}
