package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/** PROTOCOL.md, "Clipping the base delta": the Java core uploads what Python's clipping uploads. */
public class DeltaClippingTest {
  private static Safetensors.File read(Path file) throws Exception {
    return Safetensors.read(Files.readAllBytes(file));
  }

  private static void sameAsPython(String name) throws Exception {
    Path dir = HostFixtures.dir().resolve("clipping").resolve(name);
    Map<String, Tensor> received = read(dir.resolve("received.safetensors")).tensors;
    Map<String, Tensor> trained = read(dir.resolve("trained.safetensors")).tensors;
    Safetensors.File expected = read(dir.resolve("expected.safetensors"));
    List<String> names = Arrays.asList(expected.metadata.get("names").split(","));
    double bound = Double.parseDouble(expected.metadata.get("bound"));
    DeltaClipping.Clipped clipped = DeltaClipping.clip(trained, received, names, bound);
    assertEquals(Double.parseDouble(expected.metadata.get("norm")), clipped.norm, 0.0); // the same double
    assertEquals(Double.parseDouble(expected.metadata.get("scale")), clipped.scale, 0.0);
    assertEquals("1".equals(expected.metadata.get("unclipped")), clipped.unclipped);
    assertEquals(names, List.copyOf(clipped.tensors.keySet()));
    for (String n : names) {
      float[] want = expected.tensors.get(n).data();
      float[] got = clipped.tensors.get(n).data();
      assertTrue(n + " differs from Python's clipping", Arrays.equals(want, got)); // bit for bit
    }
    assertTrue(DeltaClipping.distance(clipped.tensors, received, names) <= bound); // what the server checks
  }

  @Test
  public void clipsTheRealBaseExactlyAsPython() throws Exception {
    sameAsPython("clipped");
  }

  @Test
  public void sendsADeltaWithinTheBoundUnchanged() throws Exception {
    sameAsPython("within");
  }

  @Test
  public void shrinksByTheSameMarginsWhenRoundingOvershoots() throws Exception {
    sameAsPython("margins");
  }

  @Test
  public void refusesWhatItCannotClip() {
    Map<String, Tensor> base = Map.of("w", new Tensor(new long[] {2}, new float[] {0f, 1f}));
    Map<String, Tensor> broken = Map.of("w", new Tensor(new long[] {2}, new float[] {Float.NaN, 1f}));
    List<String> names = List.of("w");
    assertThrows(IllegalArgumentException.class, () -> DeltaClipping.clip(broken, base, names, 1.0));
    assertThrows(IllegalArgumentException.class, () -> DeltaClipping.clip(base, base, names, 0.0));
    assertThrows(IllegalArgumentException.class, () -> DeltaClipping.clip(base, base, names, Double.NaN));
  }
}
