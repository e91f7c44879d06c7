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
import org.fedper.core.Backoff;
import org.fedper.core.DeviceStore;
import org.fedper.core.ProtocolClient;
import org.fedper.core.ProtocolException;
import org.fedper.core.RoundBudget;
import org.fedper.core.RoundLoop;

/**
 * One federated round in the background, only when the phone is charging, idle and on an
 * unmetered network (as production FL systems schedule training), so the user never pays for it.
 * A round never runs beside another one (they would share the head store). Everything
 * a round does, every wait and every HTTP exchange included, is within one budget that ends well
 * before WorkManager stops a worker (10 minutes); a round that would overrun it hands back with
 * Result.retry(), its trained head uncommitted.
 */
public final class RoundWorker extends Worker {
  static final String UNIQUE = "fedper-round";
  static final String UNIQUE_NOW = "fedper-round-now";
  static final String PREFS = "fedper-status";
  /**
   * Wall-clock seconds for a whole round: downloads, waits, training and upload. WorkManager
   * stops a worker at 10 minutes; the rest is margin for writing the status and closing.
   */
  static final double ROUND_BUDGET_SECONDS = 8 * 60;
  /** The longest single wait for a task (204 / Retry-After / not_in_cohort) within the budget. */
  static final double MAX_IDLE_WAIT_SECONDS = 60;
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
   * keeps the two from running at once. The user asked, so neither charging nor idle is required;
   * what is (the button's label says so): a network connection and a battery that is not low.
   * WorkManager waits until both hold and stops the round when one is lost.
   */
  static void runNow(Context context) {
    Constraints constraints = new Constraints.Builder()
        .setRequiredNetworkType(NetworkType.CONNECTED)
        .setRequiresBatteryNotLow(true)
        .build();
    WorkManager.getInstance(context).enqueueUniqueWork(UNIQUE_NOW, ExistingWorkPolicy.KEEP,
        new OneTimeWorkRequest.Builder(RoundWorker.class).setConstraints(constraints).build());
  }

  static DeviceStore store(Context context) {
    Path root = context.getFilesDir().toPath().resolve("fedper");
    return new DeviceStore(root);
  }

  @NonNull @Override
  public Result doWork() {
    Context context = getApplicationContext();
    SharedPreferences status = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE);
    if (!ROUND.tryLock()) {
      return Result.retry(); // the other job is in a round right now
    }
    List<ExecuTorchTrainer> trainers = new ArrayList<>();
    RoundBudget budget = new RoundBudget(ROUND_BUDGET_SECONDS, RoundBudget.Clock.SYSTEM, Backoff.Sleeper.REAL);
    budget.stopWhen(this::isStopped); // a constraint lost: the round stops, nothing more is sent
    try {
      RoundLoop loop = new RoundLoop(
          new ProtocolClient(BuildConfig.SERVER_URL, budget),
          store(context),
          manifest -> {
            try {
              return PhotoRatings.load(context, manifest);
            } catch (java.io.IOException ex) {
              throw new java.io.UncheckedIOException(ex);
            }
          },
          (dir, manifest) -> {
            ExecuTorchTrainer t = new ExecuTorchTrainer(dir, manifest, BuildConfig.EXECUTORCH_VERSION,
                () -> new OnnxScorer(dir.resolve(manifest.artifacts.get("onnx_model")), manifest));
            trainers.add(t);
            return t;
          },
          budget,
          MAX_IDLE_WAIT_SECONDS,
          System.nanoTime());
      loop.ensureEnrolled(BuildConfig.ENROLLMENT_KEY, "android");
      List<RoundLoop.Report> done = loop.run(1);
      if (loop.finished()) {
        // 410: the run is over for good; stop waking the phone for it.
        WorkManager.getInstance(context).cancelUniqueWork(UNIQUE);
        status.edit().putString("last", "the run is finished").apply();
      } else {
        RoundLoop.Report r = done.get(0);
        status.edit().putString("last", String.format(Locale.ROOT,
            "round %d: accuracy %s before, %s after training on %d photos",
            r.round, accuracy(r.accuracy), accuracy(r.accuracyAfter), r.numSamples)).apply();
      }
      return Result.success();
    } catch (ProtocolException.Stopped ex) {
      // WorkManager ignores a stopped worker's result and runs it again when its constraints hold.
      status.edit().putString("last", "stopped (" + ex.getMessage() + "); will try again later").apply();
      return Result.retry();
    } catch (ProtocolException.OutOfTime ex) {
      status.edit().putString("last", ex.getMessage() + "; will try again later").apply();
      return Result.retry();
    } catch (ProtocolException.Transient ex) {
      status.edit().putString("last", "network trouble; will retry").apply();
      return Result.retry();
    } catch (ProtocolException.Unauthorized ex) {
      WorkManager.getInstance(context).cancelUniqueWork(UNIQUE);
      status.edit().putString("last", "this phone is no longer enrolled (" + ex.getMessage() + ")").apply();
      return Result.failure();
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
