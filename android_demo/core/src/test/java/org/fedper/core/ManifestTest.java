package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import org.json.JSONObject;
import org.junit.Test;

/** Manifest's typed fields from a real export's manifest.json, and errors naming the bad field. */
public class ManifestTest {
  private static String exported() throws Exception {
    return new String(Files.readAllBytes(HostFixtures.dir().resolve("artifacts/manifest.json")), StandardCharsets.UTF_8);
  }

  private static String edited(String path, Object value) throws Exception {
    JSONObject root = new JSONObject(exported());
    String[] keys = path.split("\\.");
    JSONObject o = root;
    for (int k = 0; k < keys.length - 1; k++) {
      if (!o.has(keys[k])) {
        o.put(keys[k], new JSONObject());
      }
      o = o.getJSONObject(keys[k]);
    }
    if (value == null) {
      o.remove(keys[keys.length - 1]);
    } else {
      o.put(keys[keys.length - 1], value);
    }
    return root.toString();
  }

  private static void assertRefused(String json, String... inMessage) {
    IllegalArgumentException ex = assertThrows(IllegalArgumentException.class, () -> Manifest.parse(json));
    for (String s : inMessage) {
      assertTrue(ex.getMessage(), ex.getMessage().contains(s));
    }
  }

  @Test
  public void readsTheTypedFieldsOfARealExport() throws Exception {
    Manifest m = Manifest.parse(exported());
    assertEquals("forward", m.trainingMethod);
    assertEquals("all", m.trainable);
    assertEquals(2, m.minBatch);
    assertEquals(64, m.maxBatch);
    assertEquals(32, m.inputSize);
    assertEquals(10, m.numClasses);
    assertArrayEquals(new float[] {0.5f, 0.5f, 0.5f}, m.normalizationMean, 0f);
    assertArrayEquals(new float[] {0.25f, 0.25f, 0.25f}, m.normalizationStd, 0f);
    assertTrue(m.trainingParameters.contains("classifier.weight"));
    assertTrue(m.bnStatistics.contains("stem.bn.running_mean"));
    assertEquals("classifier.bias", m.headNames().get(m.headNames().size() - 1));
    assertArrayEquals(new long[] {8, 3, 3, 3}, m.base.get("stem.conv.weight"));
    assertEquals(32, m.trainingDefaults.batchSize);
    assertEquals("head", Manifest.parse(edited("training.trainable", "head")).trainable);
  }

  @Test
  public void runtimeIsOptional() throws Exception {
    assertNull(Manifest.parse(edited("runtime", null)).executorchVersion);
    assertEquals("1.0.1", Manifest.parse(edited("runtime.executorch", "1.0.1")).executorchVersion);
  }

  @Test
  public void optionalFieldsTakeTheSchemasDefaults() throws Exception {
    String json = exported();
    for (String path : new String[] {"training.local_epochs", "training.batch_size", "training.learning_rate",
        "training.momentum", "training.trainable", "training_program.method", "training_program.min_batch"}) {
      JSONObject root = new JSONObject(json);
      String[] keys = path.split("\\.");
      root.getJSONObject(keys[0]).remove(keys[1]);
      json = root.toString();
    }
    Manifest m = Manifest.parse(json);
    assertEquals(ManifestKeys.TrainingDefaults.LOCAL_EPOCHS_DEFAULT, m.trainingDefaults.localEpochs);
    assertEquals(ManifestKeys.TrainingDefaults.BATCH_SIZE_DEFAULT, m.trainingDefaults.batchSize);
    assertEquals(ManifestKeys.TrainingDefaults.LEARNING_RATE_DEFAULT, m.trainingDefaults.learningRate, 0.0);
    assertEquals(ManifestKeys.TrainingDefaults.MOMENTUM_DEFAULT, m.trainingDefaults.momentum, 0.0);
    assertEquals(ManifestKeys.TrainingDefaults.TRAINABLE_DEFAULT, m.trainable);
    assertEquals(ManifestKeys.TrainingProgramSpec.METHOD_DEFAULT, m.trainingMethod);
    assertEquals(ManifestKeys.TrainingProgramSpec.MIN_BATCH_DEFAULT, m.minBatch);
  }

  @Test
  public void missingOrMalformedFieldsAreNamed() throws Exception {
    assertRefused(edited("training.trainable", "base"), "'training.trainable'", "all, head");
    assertRefused(edited("training_program.parameters", null), "'training_program.parameters'", "missing");
    assertRefused(edited("training_program.max_batch", 1.5), "'training_program.max_batch'", "integer");
    assertRefused(edited("input.normalization.std", new org.json.JSONArray(Arrays.asList(1, 0, 1))), "'input.normalization.std'");
    assertRefused(edited("input.normalization.mean", new org.json.JSONArray(Arrays.asList(1, 1))), "'input.normalization.mean'", "3");
    assertRefused(edited("format", "fedper-manifest/2"), "'format'");
    assertRefused(edited("model", null), "'model'", "missing");
    assertRefused("{\"format\": \"fedper-manifest/1\"} trailing", "manifest.json");
    assertRefused("{\"format\": ", "manifest.json is not valid JSON");
    assertRefused("[1, 2]", "manifest.json is not a JSON object");
  }

  @Test
  public void undefinedMetricsAreNotSent() {
    Map<String, String> meta = new LinkedHashMap<>();
    RoundLoop.putMetric(meta, "accuracy", Double.NaN);
    RoundLoop.putMetric(meta, "a", Double.POSITIVE_INFINITY);
    RoundLoop.putMetric(meta, "b", 2e9);
    RoundLoop.putMetric(meta, "train_loss", 0.25);
    assertEquals(Map.of("metric.train_loss", "0.25"), meta);
  }
}
