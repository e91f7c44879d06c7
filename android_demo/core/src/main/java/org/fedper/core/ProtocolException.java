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

  /** Network trouble or a 5xx that outlasted every retry: try again later. */
  public static final class Transient extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public Transient(String message) {
      super(0, "transient", message);
    }
  }
}
