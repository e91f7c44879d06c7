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

  Task(JsonFields m) {
    this.round = m.integer("round");
    this.modelVersion = m.integer("model_version");
    this.deadline = m.string("deadline", null);
    this.baseUrl = m.string("base_url");
    this.manifestUrl = m.string("manifest_url");
    this.manifestSha256 = m.string("manifest_sha256");
    this.config = m.plainMap("config");
  }
}
