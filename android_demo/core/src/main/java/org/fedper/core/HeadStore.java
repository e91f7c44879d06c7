package org.fedper.core;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.Map;

/**
 * The personal head, in app-private storage, keyed by the pinned manifest's sha256. It is only
 * ever written here (atomically, so a crash keeps the previous head) and never sent anywhere.
 */
public final class HeadStore {
  private final Path dir;

  public HeadStore(Path dir) {
    this.dir = dir;
  }

  public Path path(String manifestSha256) {
    if (!manifestSha256.matches("[0-9a-f]{64}")) {
      throw new IllegalArgumentException("not a sha256: " + manifestSha256);
    }
    return dir.resolve(manifestSha256 + ".safetensors");
  }

  /** The saved head, or null before the first round. */
  public Map<String, Tensor> load(String manifestSha256) throws IOException {
    Path p = path(manifestSha256);
    if (!Files.exists(p)) {
      return null;
    }
    try {
      return Safetensors.read(Files.readAllBytes(p)).tensors;
    } catch (IllegalArgumentException ex) {
      throw new IOException("the head store file " + p + " is damaged: " + ex.getMessage(), ex);
    }
  }

  public void save(String manifestSha256, Map<String, Tensor> head) throws IOException {
    AtomicFiles.write(path(manifestSha256), Safetensors.write(head, Collections.emptyMap()));
  }
}
