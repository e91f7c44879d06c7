package org.fedper.core;

import java.util.Locale;
import java.util.function.BooleanSupplier;

/**
 * One wall-clock budget for everything a round does. WorkManager stops a worker after 10 minutes,
 * so every wait counts against it: backoff sleeps, Retry-After sleeps, each HTTP exchange (its
 * timeout is capped by what is left) and training (checked between steps). When a wait would not
 * fit, OutOfTime is thrown at once instead of sleeping into the limit. The scheduler's stop signal
 * (stopWhen) is checked at the same points: once it is raised, the next check, wait or exchange
 * throws Stopped instead.
 */
public final class RoundBudget {
  /** Monotonic nanoseconds; tests substitute a clock they advance themselves. */
  public interface Clock {
    long nanoTime();

    Clock SYSTEM = System::nanoTime;
  }

  private final Clock clock;
  private final Backoff.Sleeper sleeper;
  private final double seconds;
  private final long startNanos;
  private volatile BooleanSupplier stopped = () -> false;

  public RoundBudget(double seconds, Clock clock, Backoff.Sleeper sleeper) {
    if (!(seconds > 0)) {
      throw new IllegalArgumentException("a round's budget must be positive, got " + seconds + " s");
    }
    this.seconds = seconds;
    this.clock = clock;
    this.sleeper = sleeper;
    this.startNanos = clock.nanoTime();
  }

  /** No limit: a device that is not run by a scheduler (the host tests, a Linux board). */
  public static RoundBudget unlimited(Backoff.Sleeper sleeper) {
    return new RoundBudget(Double.POSITIVE_INFINITY, Clock.SYSTEM, sleeper);
  }

  /** The scheduler's stop signal (on Android, the worker's isStopped()). */
  public void stopWhen(BooleanSupplier signal) {
    this.stopped = signal;
  }

  private void checkStopped(String next) throws ProtocolException.Stopped {
    if (stopped.getAsBoolean()) {
      throw new ProtocolException.Stopped("the round was stopped before " + next);
    }
  }

  public double remainingSeconds() {
    return seconds - (clock.nanoTime() - startNanos) / 1e9;
  }

  /** Throws Stopped once the stop signal is raised, OutOfTime when nothing is left for what comes next. */
  public void check(String next) throws ProtocolException.OutOfTime, ProtocolException.Stopped {
    checkStopped(next);
    if (remainingSeconds() <= 0) {
      throw new ProtocolException.OutOfTime(String.format(Locale.ROOT,
          "the round's %.0f s budget is spent before %s", seconds, next));
    }
  }

  /** Sleeps, or throws OutOfTime without sleeping when the wait would end past the budget. */
  public void sleep(double waitSeconds, String why)
      throws InterruptedException, ProtocolException.OutOfTime, ProtocolException.Stopped {
    checkStopped(why);
    double left = remainingSeconds();
    if (waitSeconds >= left) {
      throw new ProtocolException.OutOfTime(String.format(Locale.ROOT,
          "waiting %.1f s (%s) would overrun the round's %.0f s budget (%.1f s left)", waitSeconds, why, seconds,
          Math.max(0, left)));
    }
    sleeper.sleep(waitSeconds);
  }

  /** An HTTP exchange's timeout: capMillis, or what is left of the budget if that is less. */
  public int timeoutMillis(int capMillis, String call) throws ProtocolException.OutOfTime, ProtocolException.Stopped {
    checkStopped(call);
    double left = Math.floor(remainingSeconds() * 1000);
    if (left < 1) {
      check(call);
      throw new ProtocolException.OutOfTime("less than a millisecond of the round's budget is left for " + call);
    }
    return (int) Math.min(capMillis, left);
  }
}
