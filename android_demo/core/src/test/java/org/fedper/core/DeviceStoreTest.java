package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** Bases are kept per manifest, and a stored base must have exactly its manifest's layout. */
public class DeviceStoreTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  private static Manifest manifest() throws Exception {
    Path file = HostFixtures.dir().resolve("artifacts/manifest.json");
    return Manifest.parse(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
  }

  private static byte[] base(Manifest m, float value) throws Exception {
    Map<String, Tensor> t = new LinkedHashMap<>();
    m.base.forEach((name, shape) -> t.put(name, Tensor.filled(shape, value)));
    return Safetensors.write(t, Collections.emptyMap());
  }

  @Test
  public void anOldRunsNewerVersionDoesNotShadowTheCurrentRunsBase() throws Exception {
    DeviceStore store = new DeviceStore(tmp.getRoot().toPath());
    Manifest m = manifest();
    String oldRun = "a".repeat(64);
    String newRun = "b".repeat(64);
    store.saveBase(oldRun, 50, base(m, 50f), "\"e50\"");
    store.saveBase(newRun, 0, base(m, 0f), "\"e0\"");
    assertEquals(0, store.latestBaseVersion(newRun));
    assertEquals(50, store.latestBaseVersion(oldRun));
    assertEquals(-1, store.latestBaseVersion("c".repeat(64)));
    assertEquals(0f, store.readBase(newRun, 0, m).values().iterator().next().data()[0], 0);
    assertEquals(null, store.baseEtag(newRun, 50));
    assertEquals("\"e0\"", store.baseEtag(newRun, 0));
    assertThrows(IllegalArgumentException.class, () -> store.basePath("../x", 0));
  }

  @Test
  public void aBaseWhoseNamesOrShapesDifferIsRefusedNamingTheFile() throws Exception {
    DeviceStore store = new DeviceStore(tmp.getRoot().toPath());
    Manifest m = manifest();
    String sha = "d".repeat(64);
    String first = m.baseNames().get(0);
    Map<String, Tensor> wrongShape = new LinkedHashMap<>(Safetensors.read(base(m, 1f)).tensors);
    wrongShape.put(first, Tensor.filled(new long[] {1, 2}, 1f));
    Map<String, Tensor> extra = new LinkedHashMap<>(Safetensors.read(base(m, 1f)).tensors);
    extra.put("classifier.weight", Tensor.filled(m.head.get("classifier.weight"), 1f)); // a head tensor
    Map<String, Tensor> missing = new LinkedHashMap<>(Safetensors.read(base(m, 1f)).tensors);
    missing.remove(first);
    int version = 0;
    for (Map<String, Tensor> bad : java.util.List.of(wrongShape, extra, missing)) {
      store.saveBase(sha, version, Safetensors.write(bad, Collections.emptyMap()), "\"x\"");
      final int v = version++;
      IllegalArgumentException ex = assertThrows(IllegalArgumentException.class, () -> store.readBase(sha, v, m));
      assertTrue(ex.getMessage(), ex.getMessage().contains(store.basePath(sha, v).toString()));
    }
  }
}
