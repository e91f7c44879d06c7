package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class HeadStoreTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();
  private static final String SHA = "ab".repeat(32);

  private static Map<String, Tensor> head(float value) {
    Map<String, Tensor> h = new LinkedHashMap<>();
    h.put("classifier.weight", Tensor.filled(new long[] {10, 256}, value));
    h.put("classifier.bias", Tensor.filled(new long[] {10}, -value));
    return h;
  }

  @Test
  public void savesAndLoadsExactlyAndKeepsOneFile() throws Exception {
    HeadStore store = new HeadStore(tmp.getRoot().toPath().resolve("heads"));
    assertNull(store.load(SHA));
    store.save(SHA, head(1.25f));
    store.save(SHA, head(2.5f));
    assertEquals(head(2.5f), store.load(SHA));
    try (Stream<Path> files = Files.list(tmp.getRoot().toPath().resolve("heads"))) {
      assertEquals(1, files.collect(Collectors.toList()).size()); // no temporary leftovers
    }
  }

  @Test
  public void aCrashMidWriteLeavesThePreviousHead() throws Exception {
    Path dir = tmp.getRoot().toPath().resolve("heads");
    HeadStore store = new HeadStore(dir);
    store.save(SHA, head(1f));
    // What a crash during the next save leaves: a partial temporary file beside the head.
    Files.write(dir.resolve("." + SHA + ".safetensors123.partial"), new byte[] {1, 2, 3});
    assertEquals(head(1f), store.load(SHA));
  }

  @Test
  public void aDamagedHeadIsAnErrorNamingTheFile() throws Exception {
    HeadStore store = new HeadStore(tmp.getRoot().toPath());
    Files.write(store.path(SHA), new byte[] {9, 0, 0, 0, 0, 0, 0, 0, '{'});
    IOException ex = assertThrows(IOException.class, () -> store.load(SHA));
    assertTrue(ex.getMessage().contains(store.path(SHA).toString()));
    assertThrows(IllegalArgumentException.class, () -> store.path("../../etc/passwd"));
  }

  @Test
  public void aStagedHeadCountsOnlyOnceCommitted() throws Exception {
    HeadStore store = new HeadStore(tmp.getRoot().toPath().resolve("heads"));
    store.save(SHA, head(1f));
    store.stage(SHA, head(2f));
    assertEquals(head(1f), store.load(SHA)); // the upload has not been accepted yet
    store.stage(SHA, head(3f)); // the round ran again from the committed head
    store.commit(SHA);
    assertEquals(head(3f), store.load(SHA));
    assertThrows(IllegalStateException.class, () -> store.commit(SHA)); // nothing staged any more
    store.stage(SHA, head(4f));
    store.discardStaged(SHA);
    assertEquals(head(3f), store.load(SHA));
    try (Stream<Path> files = Files.list(tmp.getRoot().toPath().resolve("heads"))) {
      assertEquals(1, files.collect(Collectors.toList()).size());
    }
  }
}
