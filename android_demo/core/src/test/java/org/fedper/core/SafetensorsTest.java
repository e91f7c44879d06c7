package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class SafetensorsTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  @Test
  public void readsWhatPythonWroteExactly() throws Exception {
    Safetensors.File f = Safetensors.read(Files.readAllBytes(HostFixtures.dir().resolve("python_written.safetensors")));
    Tensor stem = f.tensors.get("stem.conv.weight");
    assertArrayEquals(new long[] {2, 3, 2, 2}, stem.shape());
    for (int k = 0; k < 24; k++) {
      assertEquals((k - 7.5f) / 3f, stem.data()[k], 0f); // bit-exact float32
    }
    assertArrayEquals(new float[] {0.5f, -2f, 65504f, 6.1035156e-05f, 5.9604645e-08f}, f.tensors.get("half").data(), 0f);
    assertArrayEquals(new long[0], f.tensors.get("scalar").shape());
    assertEquals(42f, f.tensors.get("scalar").data()[0], 0f);
    assertEquals("written by python", f.metadata.get("note"));
    assertEquals("7", f.metadata.get("n"));
  }

  @Test
  public void pythonReadsWhatJavaWroteExactly() throws Exception {
    Map<String, Tensor> tensors = new LinkedHashMap<>();
    tensors.put("blocks.0.dw.conv.weight",
        new Tensor(new long[] {2, 3}, new float[] {1.5f, -2.25f, 3.0e-8f, (float) Math.PI, -0.0f, 1e30f}));
    tensors.put("classifier.bias", new Tensor(new long[] {3}, new float[] {0.1f, 0.2f, 0.3f}));
    Map<String, String> meta = new LinkedHashMap<>();
    meta.put("num_samples", "12");
    meta.put("base_version", "3");
    meta.put("metric.accuracy", "0.75");
    Path file = tmp.getRoot().toPath().resolve("java_written.safetensors");
    Files.write(file, Safetensors.write(tensors, meta));
    Process p = new ProcessBuilder(HostFixtures.python(), HostFixtures.script().toString(), "verify", file.toString())
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertEquals("python's safetensors disagrees: " + out, 0, p.waitFor());
    // And it reads back in Java to the same values.
    Safetensors.File back = Safetensors.read(Files.readAllBytes(file));
    assertEquals(tensors, back.tensors);
    assertEquals(meta, back.metadata);
  }

  @Test
  public void refusesMalformedFilesWithAReason() {
    Map<String, Tensor> one = new LinkedHashMap<>();
    one.put("w", new Tensor(new long[] {4}, new float[] {1, 2, 3, 4}));
    byte[] good = Safetensors.write(one, null);
    byte[] truncated = Arrays.copyOf(good, good.length - 1);
    assertTrue(assertThrows(IllegalArgumentException.class, () -> Safetensors.read(truncated))
        .getMessage().contains("offsets"));
    byte[] trailing = Arrays.copyOf(good, good.length + 4);
    assertTrue(assertThrows(IllegalArgumentException.class, () -> Safetensors.read(trailing))
        .getMessage().contains("trailing"));
    byte[] hugeHeader = good.clone();
    ByteBuffer.wrap(hugeHeader).order(ByteOrder.LITTLE_ENDIAN).putLong(0, 1L << 40);
    assertTrue(assertThrows(IllegalArgumentException.class, () -> Safetensors.read(hugeHeader))
        .getMessage().contains("header length"));
    assertThrows(IllegalArgumentException.class, () -> Safetensors.read(new byte[3]));
    assertThrows(IllegalArgumentException.class, () -> new Tensor(new long[] {2, 2}, new float[3]));
  }
}
