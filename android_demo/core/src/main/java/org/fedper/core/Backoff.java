package org.fedper.core;

import java.util.Random;

/** Exponential backoff with full jitter: attempt k waits uniform(0, min(cap, base * 2^k)). */
public final class Backoff {
  public final double baseSeconds;
  public final double capSeconds;
  public final int attempts;

  public Backoff(double baseSeconds, double capSeconds, int attempts) {
    if (attempts < 1) {
      throw new IllegalArgumentException("attempts must be >= 1");
    }
    this.baseSeconds = baseSeconds;
    this.capSeconds = capSeconds;
    this.attempts = attempts;
  }

  public static Backoff standard() {
    return new Backoff(0.5, 30.0, 8);
  }

  public double delaySeconds(int attempt, Random rng) {
    return rng.nextDouble() * Math.min(capSeconds, baseSeconds * Math.pow(2, attempt));
  }

  /** How the loop waits; tests replace it to run instantly. */
  public interface Sleeper {
    void sleep(double seconds) throws InterruptedException;

    Sleeper REAL = seconds -> Thread.sleep((long) (seconds * 1000));
  }
}
