package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** A .ptd written by ExecuTorch's serializer, read and rewritten in Java, read back by ExecuTorch. */
public class PtdFileTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  @Test
  public void readsAndRewritesWeightsThatExecuTorchReadsBack() throws Exception {
    PtdFile ptd = new PtdFile(Files.readAllBytes(HostFixtures.dir().resolve("python_written.ptd")));
    assertArrayEquals(new long[] {4, 3, 3, 3}, ptd.shapes().get("stem.conv.weight"));
    Tensor stem = ptd.get("stem.conv.weight");
    for (int k = 0; k < 108; k++) {
      assertEquals((k - 50) / 7f, stem.data()[k], 0f);
    }
    assertEquals(0.5f, ptd.get("blocks.0.dw.bn.running_var").data()[0], 0f);
    Map<String, Tensor> next = new LinkedHashMap<>();
    for (String name : ptd.shapes().keySet()) {
      float[] v = ptd.get(name).data().clone();
      for (int k = 0; k < v.length; k++) {
        v[k] = 1 - 2 * v[k];
      }
      next.put(name, new Tensor(ptd.shapes().get(name), v));
    }
    ptd.set(next);
    Path out = tmp.getRoot().toPath().resolve("java_written.ptd");
    Files.write(out, ptd.toBytes());
    Process p = new ProcessBuilder(HostFixtures.python(), HostFixtures.script().toString(), "verify-ptd", out.toString())
        .redirectErrorStream(true).start();
    String said = new String(p.getInputStream().readAllBytes());
    assertEquals("ExecuTorch's reader disagrees: " + said, 0, p.waitFor());
  }

  @Test
  public void refusesWrongNamesShapesAndFiles() throws Exception {
    PtdFile ptd = new PtdFile(Files.readAllBytes(HostFixtures.dir().resolve("python_written.ptd")));
    Map<String, Tensor> wrong = new LinkedHashMap<>();
    wrong.put("classifier.bias", Tensor.filled(new long[] {4}, 0f));
    assertThrows(IllegalArgumentException.class, () -> ptd.set(wrong));
    assertThrows(IllegalArgumentException.class, () -> ptd.get("nope"));
    assertThrows(IllegalArgumentException.class, () -> new PtdFile(new byte[64]));
  }
}
