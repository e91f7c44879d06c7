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

  Task(Map<String, Object> m) {
    this.round = ((Number) m.get("round")).longValue();
    this.modelVersion = ((Number) m.get("model_version")).longValue();
    this.deadline = m.get("deadline") == null ? null : String.valueOf(m.get("deadline"));
    this.baseUrl = String.valueOf(m.get("base_url"));
    this.manifestUrl = String.valueOf(m.get("manifest_url"));
    this.manifestSha256 = String.valueOf(m.get("manifest_sha256"));
    @SuppressWarnings("unchecked")
    Map<String, Object> config = (Map<String, Object>) m.getOrDefault("config", java.util.Collections.emptyMap());
    this.config = config;
  }
}
