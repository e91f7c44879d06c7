package org.fedper.core;

import java.util.Locale;

/**
 * Whether this app's runtimes can run an export. ExecuTorch: only programs written by the
 * runtime's own minor release, because ExecuTorch promises no forward compatibility and backward
 * compatibility only for stable APIs, and the training export is experimental
 * (runtime/COMPATIBILITY.md). ONNX Runtime: models up to the opset and IR version its release
 * implements. The versions themselves are stated once, in android_demo/gradle.properties.
 */
public final class RuntimeVersions {
  private RuntimeVersions() {}

  /**
   * ONNX Runtime release (major.minor) -> {highest ai.onnx opset, highest IR version} it runs,
   * from docs/Versioning.md of microsoft/onnxruntime (see android_demo/README.md).
   */
  private static final String[][] ONNX_RUNTIME = {
    {"1.17", "20", "9"},
    {"1.18", "21", "10"},
    {"1.19", "21", "10"},
    {"1.20", "21", "10"},
  };

  /** @throws IllegalArgumentException naming both versions when the runtime is not the exporter's minor release */
  public static void requireLoadable(String exporterVersion, String runtimeVersion) {
    int[] runtime = majorMinor(runtimeVersion);
    if (runtime == null) {
      throw new IllegalArgumentException("the app's ExecuTorch runtime version '" + runtimeVersion + "' is not major.minor[.patch]");
    }
    String accepted = "executorch " + runtime[0] + "." + runtime[1] + ".x";
    if (exporterVersion == null) {
      throw new IllegalArgumentException("manifest.json has no runtime.executorch: the export predates that field, so"
          + " the app cannot tell whether its ExecuTorch runtime " + runtimeVersion + " loads its programs; re-export with "
          + accepted);
    }
    int[] exporter = majorMinor(exporterVersion);
    if (exporter == null || exporter[0] != runtime[0] || exporter[1] != runtime[1]) {
      throw new IllegalArgumentException("the programs were written by executorch " + exporterVersion + "; this app's"
          + " ExecuTorch runtime " + runtimeVersion + " loads only programs from " + accepted
          + " (set executorchVersion in android_demo/gradle.properties to the exporter's version)");
    }
  }

  /** The highest opset and IR version ONNX Runtime ortVersion runs, or null when not in the table. */
  public static int[] onnxLimits(String ortVersion) {
    int[] v = majorMinor(ortVersion);
    if (v == null) {
      return null;
    }
    String key = v[0] + "." + v[1];
    for (String[] row : ONNX_RUNTIME) {
      if (row[0].equals(key)) {
        return new int[] {Integer.parseInt(row[1]), Integer.parseInt(row[2])};
      }
    }
    return null;
  }

  /** @throws IllegalArgumentException when model.onnx's opset is beyond what ortVersion runs */
  public static void requireScorable(int opset, String ortVersion) {
    int[] limits = onnxLimits(ortVersion);
    if (limits == null) {
      throw new IllegalArgumentException("ONNX Runtime " + ortVersion + " is not in RuntimeVersions' table of"
          + " supported opsets; add its row from onnxruntime's docs/Versioning.md");
    }
    if (opset < 1) {
      throw new IllegalArgumentException("manifest.json has no runtime.onnx_opset: re-export so the app can tell"
          + " whether ONNX Runtime " + ortVersion + " runs model.onnx");
    }
    if (opset > limits[0]) {
      throw new IllegalArgumentException(String.format(Locale.ROOT,
          "model.onnx uses opset %d; this app's ONNX Runtime %s runs opsets up to %d", opset, ortVersion, limits[0]));
    }
  }

  /** Major and minor of "1.5.1", "1.6.0a0", "1.5.1+cpu"; null if it does not start that way. */
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
