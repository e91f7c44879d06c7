package org.fedper.core;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.Map;

/**
 * The personal head, in app-private storage, keyed by the pinned manifest's sha256. It is only
 * ever written here (atomically, so a crash keeps the previous head) and never sent anywhere.
 *
 * <p>A round's trained head is staged, and committed only when the server has accepted the
 * round's base: a round that fails after training (its upload refused or lost) runs again from
 * the committed head, so the head never trains twice on the same photos for one base update.
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

  public Path stagedPath(String manifestSha256) {
    return path(manifestSha256).resolveSibling(manifestSha256 + ".staged");
  }

  /** Keeps a trained head aside; load() still returns the committed one. */
  public void stage(String manifestSha256, Map<String, Tensor> head) throws IOException {
    AtomicFiles.write(stagedPath(manifestSha256), Safetensors.write(head, Collections.emptyMap()));
  }

  /** The staged head becomes the head (one rename: a crash leaves one or the other whole). */
  public void commit(String manifestSha256) throws IOException {
    Path staged = stagedPath(manifestSha256);
    if (!Files.exists(staged)) {
      throw new IllegalStateException("no staged head to commit for " + manifestSha256);
    }
    AtomicFiles.replace(staged, path(manifestSha256));
  }

  /** Drops a staged head that was never committed (its round's upload was not accepted). */
  public void discardStaged(String manifestSha256) throws IOException {
    Files.deleteIfExists(stagedPath(manifestSha256));
  }
}
