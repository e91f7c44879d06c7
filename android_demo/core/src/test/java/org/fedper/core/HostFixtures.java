package org.fedper.core;

import java.nio.file.Path;
import java.nio.file.Paths;

/**
 * Where host-test.sh put the Python side (-Dfedper.python, -Dfedper.fixtures, -Dfedper.script)
 * and the protocol's known-answer vectors (-Dfedper.vectors: docs/secagg_vectors.json).
 */
final class HostFixtures {
  private HostFixtures() {}

  static String python() {
    return required("fedper.python");
  }

  static Path dir() {
    return Paths.get(required("fedper.fixtures"));
  }

  static Path script() {
    return Paths.get(required("fedper.script"));
  }

  static Path vectors() {
    return Paths.get(required("fedper.vectors"));
  }

  private static String required(String key) {
    String v = System.getProperty(key);
    if (v == null || v.isEmpty()) {
      throw new IllegalStateException("run through android_demo/core/host-test.sh (-D" + key + " is not set)");
    }
    return v;
  }
}
