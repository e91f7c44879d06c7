package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.Test;

/**
 * One ExecuTorch release end to end: the runtime the app bundles (android_demo/gradle.properties,
 * used by app/build.gradle) is the exporter's (pyproject.toml's pin, and what a real export's
 * manifest says wrote it), and the bundled ONNX Runtime runs the opset and IR version the
 * exporter writes. This is the check `make android-test` fails on when they drift apart.
 */
public class RuntimeVersionsTest {
  private static Path repo() {
    return HostFixtures.script().toAbsolutePath().getParent().getParent().getParent(); // android_demo/core/x.py
  }

  private static Properties gradle() throws Exception {
    Properties p = new Properties();
    try (InputStream in = Files.newInputStream(repo().resolve("android_demo/gradle.properties"))) {
      p.load(in);
    }
    return p;
  }

  private static Manifest exported() throws Exception {
    Path file = HostFixtures.dir().resolve("artifacts/manifest.json");
    return Manifest.parse(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
  }

  private static String read(String relative) throws Exception {
    return new String(Files.readAllBytes(repo().resolve(relative)), StandardCharsets.UTF_8);
  }

  @Test
  public void theAppBundlesTheExportersExecuTorchRelease() throws Exception {
    String app = gradle().getProperty("executorchVersion");
    assertNotNull("android_demo/gradle.properties sets no executorchVersion", app);
    Matcher pin = Pattern.compile("\"executorch==([^\"]+)\"").matcher(read("pyproject.toml"));
    assertTrue("pyproject.toml pins no executorch==", pin.find());
    assertEquals("the app's executorch-android (gradle.properties) and the exporter's pin (pyproject.toml)",
        pin.group(1), app);
    assertEquals("the app's executorch-android and the executorch that wrote the fixture export",
        exported().executorchVersion, app);
    RuntimeVersions.requireLoadable(exported().executorchVersion, app);
    String build = read("android_demo/app/build.gradle");
    assertTrue("app/build.gradle must take executorch-android's version from gradle.properties",
        build.contains("\"org.pytorch:executorch-android:${executorchVersion}\""));
    assertTrue(build.contains("\"EXECUTORCH_VERSION\", \"\\\"${executorchVersion}\\\"\""));
  }

  @Test
  public void onlyTheRuntimesOwnMinorReleaseLoads() {
    RuntimeVersions.requireLoadable("1.5.1", "1.5.1");
    RuntimeVersions.requireLoadable("1.5.0", "1.5.1");
    for (String other : new String[] {"1.4.1", "1.6.0", "2.5.1", "1.3.1", "garbage"}) {
      IllegalArgumentException ex =
          assertThrows(IllegalArgumentException.class, () -> RuntimeVersions.requireLoadable(other, "1.5.1"));
      assertTrue(ex.getMessage(), ex.getMessage().contains(other) && ex.getMessage().contains("1.5.1"));
    }
    IllegalArgumentException old = assertThrows(IllegalArgumentException.class, () -> RuntimeVersions.requireLoadable(null, "1.5.1"));
    assertTrue(old.getMessage(), old.getMessage().contains("runtime.executorch"));
  }

  @Test
  public void theBundledOnnxRuntimeRunsTheExportersOpsetAndIrVersion() throws Exception {
    String ort = gradle().getProperty("onnxruntimeVersion");
    assertNotNull("android_demo/gradle.properties sets no onnxruntimeVersion", ort);
    assertTrue(read("android_demo/app/build.gradle")
        .contains("\"com.microsoft.onnxruntime:onnxruntime-android:${onnxruntimeVersion}\""));
    int[] limits = RuntimeVersions.onnxLimits(ort);
    assertNotNull("ONNX Runtime " + ort + " is not in RuntimeVersions' table", limits);
    int opset = exported().onnxOpset;
    assertTrue("the manifest states runtime.onnx_opset", opset > 0);
    RuntimeVersions.requireScorable(opset, ort);
    // The IR version of a real export's model.onnx, as the onnx package reads it (host_fixtures.py).
    int ir = Integer.parseInt(new String(Files.readAllBytes(HostFixtures.dir().resolve("onnx/ir_version.txt")),
        StandardCharsets.UTF_8).trim());
    assertTrue("model.onnx has IR version " + ir + "; ONNX Runtime " + ort + " reads up to " + limits[1], ir <= limits[1]);
    IllegalArgumentException tooNew =
        assertThrows(IllegalArgumentException.class, () -> RuntimeVersions.requireScorable(limits[0] + 1, ort));
    assertTrue(tooNew.getMessage(), tooNew.getMessage().contains("opset " + (limits[0] + 1)));
    assertThrows(IllegalArgumentException.class, () -> RuntimeVersions.requireScorable(-1, ort));
  }
}
