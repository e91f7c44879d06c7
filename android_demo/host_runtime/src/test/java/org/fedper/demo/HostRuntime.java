package org.fedper.demo;

import com.facebook.soloader.nativeloader.NativeLoader;
import com.facebook.soloader.nativeloader.NativeLoaderDelegate;
import java.io.File;

/**
 * Points ExecuTorch's Kotlin classes at the host build of their JNI library (host_runtime/build.sh,
 * -Dfedper.runtime.lib). On Android the AAR's libexecutorch.so is found by name; on the host that
 * name is the Python wheel's runtime itself, so the JNI library is libexecutorch_jni.so and this
 * delegate (SoLoader's public hook) maps the name.
 */
public final class HostRuntime implements NativeLoaderDelegate {
  private final File dir;

  private HostRuntime(File dir) {
    this.dir = dir;
  }

  /** Before the first ExecuTorch class loads; again is a no-op. */
  public static synchronized void init() {
    if (NativeLoader.isInitialized()) {
      return;
    }
    String lib = System.getProperty("fedper.runtime.lib");
    if (lib == null || lib.isEmpty()) {
      throw new IllegalStateException("run through android_demo/core/host-test.sh (-Dfedper.runtime.lib is not set)");
    }
    NativeLoader.init(new HostRuntime(new File(lib)));
  }

  private File fileFor(String shortName) {
    return new File(dir, "executorch".equals(shortName) ? "libexecutorch_jni.so" : "lib" + shortName + ".so");
  }

  @Override public boolean loadLibrary(String shortName, int flags) {
    System.load(fileFor(shortName).getAbsolutePath());
    return true;
  }

  @Override public String getLibraryPath(String libName) {
    return fileFor(libName).getAbsolutePath();
  }

  @Override public int getSoSourcesVersion() {
    return 0;
  }
}
