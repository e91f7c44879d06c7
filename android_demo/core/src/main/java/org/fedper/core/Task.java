package org.fedper.core;

import java.util.Map;

/** GET /v1/task's answer: one round to take part in. */
public final class Task {
  public final long round;
  public final long modelVersion;
  public final String deadline;
  public final String baseUrl;
  public final String manifestUrl;
  public final String manifestSha256;
  public final Map<String, Object> config;
  /** Since revision 1.5: the L2 norm the base delta is clipped to (DP-FedAvg); null: no clipping. */
  public final Double clipNorm;
  /** Since revision 1.6: the round is securely aggregated (docs/SECAGG.md); null: it is not. */
  public final SecAgg secagg;

  /** The task's secagg: the round's session and its encoding. */
  public static final class SecAgg {
    public final String session;
    public final int cohort;
    public final int neighbours;
    public final int threshold;
    public final double clipNorm;
    public final long weightCap;

    SecAgg(JsonFields m) {
      this.session = m.string(Protocol.Body.SecAggTask.SESSION);
      this.cohort = (int) m.integer(Protocol.Body.SecAggTask.COHORT);
      this.neighbours = (int) m.integer(Protocol.Body.SecAggTask.NEIGHBOURS);
      this.threshold = (int) m.integer(Protocol.Body.SecAggTask.THRESHOLD);
      this.clipNorm = m.number(Protocol.Body.SecAggTask.CLIP_NORM);
      this.weightCap = m.integer(Protocol.Body.SecAggTask.WEIGHT_CAP);
    }
  }

  Task(JsonFields m) {
    this.round = m.integer("round");
    this.modelVersion = m.integer("model_version");
    this.deadline = m.string("deadline", null);
    this.baseUrl = m.string("base_url");
    this.manifestUrl = m.string("manifest_url");
    this.manifestSha256 = m.string("manifest_sha256");
    this.config = m.plainMap("config");
    this.clipNorm = clipNorm(m);
    this.secagg = m.has(Protocol.Body.Task.SECAGG) ? new SecAgg(m.object(Protocol.Body.Task.SECAGG)) : null;
  }

  private static Double clipNorm(JsonFields m) {
    if (!m.has(Protocol.Body.Task.DP)) { // absent or null
      return null;
    }
    double clip = m.object(Protocol.Body.Task.DP).number(Protocol.Body.DPTask.CLIP_NORM);
    if (!(clip > 0 && clip < Double.POSITIVE_INFINITY)) {
      throw new IllegalArgumentException("dp.clip_norm must be a finite number > 0, got " + clip);
    }
    return clip;
  }
}
