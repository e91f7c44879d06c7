package org.fedper.demo;

/**
 * Which exported programs the bundled ExecuTorch runtime can load. ExecuTorch guarantees only
 * backward compatibility: a .pte written by version X loads in runtimes from X up to at least the
 * next minor release (runtime/COMPATIBILITY.md); a newer .pte in an older runtime may fail. So the
 * app accepts programs written by the runtime's own minor release or the one before it.
 */
final class ExecuTorchVersions {
  /** The org.pytorch:executorch-android version in app/build.gradle (keep the two equal). */
  static final String RUNTIME = "1.3.1";

  private ExecuTorchVersions() {}

  /** @throws IllegalArgumentException naming both versions when the runtime cannot load the export */
  static void requireLoadable(String exporterVersion) {
    if (exporterVersion == null) {
      throw new IllegalArgumentException("manifest.json has no runtime.executorch: the export predates that field,"
          + " so the app cannot tell whether its ExecuTorch runtime " + RUNTIME + " loads its programs; re-export with "
          + acceptedRange());
    }
    int[] exporter = majorMinor(exporterVersion);
    int[] runtime = majorMinor(RUNTIME);
    boolean loadable = exporter != null && exporter[0] == runtime[0]
        && exporter[1] <= runtime[1] && exporter[1] >= runtime[1] - 1;
    if (!loadable) {
      throw new IllegalArgumentException("the programs were written by executorch " + exporterVersion
          + "; this app's ExecuTorch runtime " + RUNTIME + " is only guaranteed to load programs from " + acceptedRange());
    }
  }

  private static String acceptedRange() {
    int[] r = majorMinor(RUNTIME);
    return "executorch " + r[0] + "." + (r[1] - 1) + ".x or " + r[0] + "." + r[1] + ".x";
  }

  /** Major and minor of "1.3.1", "1.4.0a0", "1.3.1+cpu"; null if it does not start that way. */
  static int[] majorMinor(String version) {
    String[] parts = version.trim().split("\\.");
    if (parts.length < 2) {
      return null;
    }
    try {
      return new int[] {Integer.parseInt(parts[0]), Integer.parseInt(parts[1].replaceAll("\\D.*$", ""))};
    } catch (NumberFormatException ex) {
      return null;
    }
  }
}
