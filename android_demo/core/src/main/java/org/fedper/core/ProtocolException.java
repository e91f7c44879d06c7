package org.fedper.core;

/** What the server said, or could not say. Subclasses tell the round loop what to do next. */
public class ProtocolException extends Exception {
  private static final long serialVersionUID = 1L;
  public final int status;
  public final String code;

  public ProtocolException(int status, String code, String message) {
    super(status + " " + code + ": " + message);
    this.status = status;
    this.code = code;
  }

  /** 410 run_finished: stop taking part. */
  public static final class RunFinished extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public RunFinished() {
      super(410, Protocol.ErrorCode.RUN_FINISHED, "the run is finished");
    }
  }

  /**
   * 409 not_in_cohort: this device holds no unexpired slot of the round (its slot expired, or it
   * never had one). Not a failure: wait Retry-After and ask for a task again (PROTOCOL.md).
   */
  public static final class NotInCohort extends ProtocolException {
    private static final long serialVersionUID = 1L;
    public final double retryAfterSeconds;

    public NotInCohort(double retryAfterSeconds, String message) {
      super(409, Protocol.ErrorCode.NOT_IN_COHORT, message);
      this.retryAfterSeconds = retryAfterSeconds;
    }
  }

  /** 401: the token is unknown or revoked, or the enrollment key is wrong. */
  public static final class Unauthorized extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public Unauthorized(String code, String message) {
      super(401, code, message);
    }
  }

  /**
   * The round's time budget is spent (or the next wait would overrun it): hand back to the
   * scheduler and try later. Nothing was committed: the head store still holds the last head
   * the server's acceptance committed.
   */
  public static final class OutOfTime extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public OutOfTime(String message) {
      super(0, "out_of_time", message);
    }
  }

  /**
   * The scheduler stopped the round (WorkManager stops a worker when a constraint is lost: the
   * phone unplugged, off Wi-Fi): nothing more is sent and the trained head stays uncommitted, as
   * for OutOfTime; WorkManager runs the work again when the constraints hold.
   */
  public static final class Stopped extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public Stopped(String message) {
      super(0, "stopped", message);
    }
  }

  /** Network trouble or a 5xx that outlasted every retry: try again later. */
  public static final class Transient extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public Transient(String message) {
      super(0, "transient", message);
    }
  }
}
