package org.fedper.core;

import java.nio.file.Path;
import java.nio.file.Paths;

/** Where host-test.sh put the Python side: -Dfedper.python and -Dfedper.fixtures. */
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

  private static String required(String key) {
    String v = System.getProperty(key);
    if (v == null || v.isEmpty()) {
      throw new IllegalStateException("run through android_demo/core/host-test.sh (-D" + key + " is not set)");
    }
    return v;
  }
}
