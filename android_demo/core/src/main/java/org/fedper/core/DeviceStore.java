package org.fedper.core;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * The device's cache and identity, beside the head store: credentials, the pinned manifest,
 * artifacts by sha256 and downloaded bases with their ETags. Same layout as the Python device.
 */
public final class DeviceStore {
  private final Path root;
  public final HeadStore heads;

  public DeviceStore(Path root) {
    this.root = root;
    this.heads = new HeadStore(root.resolve("heads"));
  }

  public Path root() {
    return root;
  }

  /** {deviceId, token}, or null before enrollment. */
  public String[] credentials() throws IOException {
    Path p = root.resolve("device.json");
    if (!Files.exists(p)) {
      return null;
    }
    JsonFields m = JsonFields.parse(new String(Files.readAllBytes(p), StandardCharsets.UTF_8), p.toString());
    return new String[] {m.string("device_id"), m.string("token")};
  }

  public void saveCredentials(String deviceId, String token) throws IOException {
    JSONObject m = new JSONObject();
    try {
      m.put("device_id", deviceId);
      m.put("token", token);
    } catch (JSONException ex) {
      throw new IllegalArgumentException("device id or token is null", ex);
    }
    AtomicFiles.write(root.resolve("device.json"), m.toString().getBytes(StandardCharsets.UTF_8));
  }

  public String pinnedManifest() throws IOException {
    Path p = root.resolve("pinned_manifest");
    return Files.exists(p) ? new String(Files.readAllBytes(p), StandardCharsets.UTF_8).trim() : null;
  }

  public void pinManifest(String sha256) throws IOException {
    AtomicFiles.write(root.resolve("pinned_manifest"), (sha256 + "\n").getBytes(StandardCharsets.UTF_8));
  }

  public Path artifactDir(String manifestSha256) throws IOException {
    Path p = root.resolve("artifacts").resolve(manifestSha256);
    Files.createDirectories(p);
    return p;
  }

  /**
   * Bases are kept per manifest: model versions count from 0 in every run, so a version number
   * means nothing without the manifest it belongs to (an old run's v50 is not newer than v0).
   */
  public Path basePath(String manifestSha256, long version) {
    return baseDir(manifestSha256).resolve("v" + version + ".safetensors");
  }

  private Path baseDir(String manifestSha256) {
    if (!manifestSha256.matches("[0-9a-f]{64}")) {
      throw new IllegalArgumentException("not a sha256: " + manifestSha256);
    }
    return root.resolve("bases").resolve(manifestSha256);
  }

  public String baseEtag(String manifestSha256, long version) throws IOException {
    Path p = baseDir(manifestSha256).resolve("v" + version + ".etag");
    return Files.exists(p) && Files.exists(basePath(manifestSha256, version))
        ? new String(Files.readAllBytes(p), StandardCharsets.UTF_8).trim()
        : null;
  }

  /** The newest model version of this manifest on disk, or -1. */
  public long latestBaseVersion(String manifestSha256) throws IOException {
    Path dir = baseDir(manifestSha256);
    long latest = -1;
    if (Files.isDirectory(dir)) {
      try (java.util.stream.Stream<Path> files = Files.list(dir)) {
        for (Path p : (Iterable<Path>) files::iterator) {
          String n = p.getFileName().toString();
          if (n.matches("v[0-9]{1,18}\\.safetensors")) {
            latest = Math.max(latest, Long.parseLong(n.substring(1, n.indexOf('.'))));
          }
        }
      }
    }
    return latest;
  }

  public void saveBase(String manifestSha256, long version, byte[] body, String etag) throws IOException {
    AtomicFiles.write(basePath(manifestSha256, version), body);
    AtomicFiles.write(baseDir(manifestSha256).resolve("v" + version + ".etag"), etag.getBytes(StandardCharsets.UTF_8));
    for (long old = version - 2; old >= 0; old--) { // keep the latest two versions
      if (!Files.deleteIfExists(basePath(manifestSha256, old))) {
        break;
      }
      Files.deleteIfExists(baseDir(manifestSha256).resolve("v" + old + ".etag"));
    }
  }

  /**
   * A stored base of this manifest, refused (IllegalArgumentException naming the file) unless
   * its tensor names and shapes are exactly the manifest's base.
   */
  public Map<String, Tensor> readBase(String manifestSha256, long version, Manifest manifest) throws IOException {
    return Manifest.readChecked(basePath(manifestSha256, version), manifest.base);
  }
}
