package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import org.junit.Test;

/**
 * `./gradlew assembleDebug` builds the APK where an Android SDK exists: the wrapper pins Gradle
 * 8.7 (what AGP 8.5 needs) and its jar is Gradle's own, by the sha256 Gradle publishes for the
 * 8.7 wrapper jar (gradle/actions sources/src/wrapper-validation/wrapper-checksums.json, the
 * list wrapper validation checks against; see android_demo/README.md).
 */
public class GradleWrapperTest {
  static final String GRADLE_8_7_WRAPPER_JAR_SHA256 = "cb0da6751c2b753a16ac168bb354870ebb1e162e9083f116729cec9c781156b8";

  private static Path demo() {
    return HostFixtures.script().toAbsolutePath().getParent().getParent(); // android_demo/core/x.py
  }

  @Test
  public void theWrapperIsGradles87() throws Exception {
    Path jar = demo().resolve("gradle/wrapper/gradle-wrapper.jar");
    assertEquals(jar + " is not Gradle's 8.7 wrapper jar", GRADLE_8_7_WRAPPER_JAR_SHA256,
        ProtocolClient.sha256Hex(Files.readAllBytes(jar)));
    Properties p = new Properties();
    try (InputStream in = Files.newInputStream(demo().resolve("gradle/wrapper/gradle-wrapper.properties"))) {
      p.load(in);
    }
    assertEquals("https://services.gradle.org/distributions/gradle-8.7-bin.zip", p.getProperty("distributionUrl"));
    assertTrue("gradlew must be executable", Files.isExecutable(demo().resolve("gradlew")));
    assertTrue(Files.exists(demo().resolve("gradlew.bat")));
  }
}
