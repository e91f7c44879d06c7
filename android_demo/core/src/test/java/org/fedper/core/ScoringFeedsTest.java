package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.Before;
import org.junit.Test;

/**
 * The scoring contract against the real export: the input names ONNX Runtime reports for the
 * exported model.onnx (host_fixtures.py onnx-inputs) are exactly what the phone feeds.
 */
public class ScoringFeedsTest {
  private Manifest manifest;
  private List<String> modelInputs;
  private Map<String, Tensor> weights;
  private Tensor image;

  @Before
  public void load() throws Exception {
    Path artifacts = HostFixtures.dir().resolve("artifacts");
    manifest = Manifest.parse(new String(Files.readAllBytes(artifacts.resolve("manifest.json")), StandardCharsets.UTF_8));
    modelInputs = new ArrayList<>();
    for (String line : Files.readAllLines(HostFixtures.dir().resolve("onnx").resolve("input_names.txt"))) {
      if (!line.isEmpty()) {
        modelInputs.add(line);
      }
    }
    weights = new LinkedHashMap<>();
    weights.putAll(Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_base")))).tensors);
    weights.putAll(Safetensors.read(Files.readAllBytes(artifacts.resolve(manifest.artifacts.get("initial_head")))).tensors);
    int s = manifest.inputSize;
    image = Tensor.filled(new long[] {2, 3, s, s}, 0.5f);
  }

  private Set<String> inputs() {
    return new LinkedHashSet<>(modelInputs);
  }

  private static String message(Runnable call) {
    return assertThrows(IllegalArgumentException.class, call::run).getMessage();
  }

  @Test
  public void feedsAreExactlyTheExportedModelsInputs() {
    assertTrue("the export has weight inputs besides the image: " + modelInputs, modelInputs.size() > 1);
    Map<String, Tensor> feeds = ScoringFeeds.feeds(manifest, inputs(), image, weights);
    assertEquals(modelInputs, new ArrayList<>(feeds.keySet()));
    assertSame(image, feeds.get(ScoringFeeds.IMAGE));
    for (String name : manifest.baseNames()) {
      assertSame(weights.get(name), feeds.get(name));
    }
    for (String name : manifest.headNames()) {
      assertSame(weights.get(name), feeds.get(name));
    }
  }

  @Test
  public void aMissingWeightIsNamed() {
    String head = manifest.headNames().get(0);
    weights.remove(head);
    assertTrue(message(() -> ScoringFeeds.feeds(manifest, inputs(), image, weights)).contains(head));
  }

  @Test
  public void anExtraWeightIsRefused() {
    weights.put("not.a.model.weight", Tensor.filled(new long[] {1}, 0f));
    assertTrue(message(() -> ScoringFeeds.feeds(manifest, inputs(), image, weights)).contains("not.a.model.weight"));
  }

  @Test
  public void aMisshapedWeightIsNamedWithBothShapes() {
    String base = manifest.baseNames().get(0);
    weights.put(base, Tensor.filled(new long[] {1, 2}, 0f));
    String m = message(() -> ScoringFeeds.feeds(manifest, inputs(), image, weights));
    assertTrue(m, m.contains(base) && m.contains("[1, 2]") && m.contains(Arrays.toString(manifest.base.get(base))));
  }

  @Test
  public void aModelInputTheManifestDoesNotKnowIsRefused() {
    Set<String> names = inputs();
    names.add("mystery");
    assertTrue(message(() -> ScoringFeeds.feeds(manifest, names, image, weights)).contains("mystery"));
  }

  @Test
  public void aModelWhoseWeightsAreInitializersIsRefused() {
    String m = message(() -> ScoringFeeds.feeds(manifest, Collections.singleton("input"), image, weights));
    assertTrue(m, m.contains("initializers") && m.contains(manifest.headNames().get(0)));
  }

  @Test
  public void aModelWithoutTheImageInputIsRefused() {
    Set<String> names = inputs();
    names.remove(ScoringFeeds.IMAGE);
    assertTrue(message(() -> ScoringFeeds.feeds(manifest, names, image, weights)).contains("'input'"));
  }

  @Test
  public void anImageOfTheWrongSizeIsRefused() {
    Tensor small = Tensor.filled(new long[] {1, 3, 8, 8}, 0f);
    assertTrue(message(() -> ScoringFeeds.feeds(manifest, inputs(), small, weights)).contains("[1, 3, 8, 8]"));
  }
}
