package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * docs/SECAGG.md: the Java core's side of a SecAgg+ round gives Python's bytes (host_fixtures.py
 * writes secagg/case.json with Python's sessions of the same devices), and what it seals for its
 * neighbours opens in Python's sessions and gives back its secrets.
 */
public class SecAggTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  private static JSONObject caseJson() throws Exception {
    Path file = HostFixtures.dir().resolve("secagg").resolve("case.json");
    return new JSONObject(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
  }

  private static byte[] hex(String s) {
    return SecAggCrypto.hex(s);
  }

  private static String toHex(byte[] b) {
    StringBuilder out = new StringBuilder();
    for (byte x : b) {
      out.append(String.format("%02x", x & 0xFF));
    }
    return out.toString();
  }

  private static int[] words(String hexWords) {
    byte[] bytes = hex(hexWords);
    int[] out = new int[bytes.length / 4];
    ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().get(out);
    return out;
  }

  private static SecAggDevice javaDevice(JSONObject c) throws Exception {
    JSONObject secrets = c.getJSONObject("java");
    return new SecAggDevice("java", hex(c.getString("context")), hex(secrets.getString("channel")),
        hex(secrets.getString("mask")), hex(secrets.getString("seed")), new SecureRandom());
  }

  private static Map<String, SecAggDevice.Advertisement> neighbours(JSONObject c) throws Exception {
    Map<String, SecAggDevice.Advertisement> out = new TreeMap<>();
    JSONObject ads = c.getJSONObject("advertised");
    for (String name : ads.keySet()) {
      if (!name.equals("java")) {
        JSONObject a = ads.getJSONObject(name);
        out.put(name, new SecAggDevice.Advertisement(hex(a.getString("channel")), hex(a.getString("mask"))));
      }
    }
    return out;
  }

  private static List<String> strings(JSONArray array) throws Exception {
    List<String> out = new ArrayList<>();
    for (int i = 0; i < array.length(); i++) {
      out.add(array.getString(i));
    }
    return out;
  }

  @Test
  public void theCryptographyGivesPythonsBytes() throws Exception {
    JSONObject c = caseJson();
    JSONObject prg = c.getJSONObject("prg");
    assertArrayEquals(words(prg.getString("words")), SecAggCrypto.expand(hex(prg.getString("seed")), 9));
    JSONObject agree = c.getJSONObject("agree");
    byte[] theirs = hex(c.getJSONObject("advertised").getJSONObject(agree.getString("with")).getString("mask"));
    byte[] mine = hex(c.getJSONObject("java").getString("mask"));
    assertEquals(agree.getString("mask"),
        toHex(SecAggCrypto.agree(mine, theirs, SecAggCrypto.MASK, hex(c.getString("context")))));
    JSONObject advertised = c.getJSONObject("advertised").getJSONObject("java");
    SecAggDevice.Advertisement own = javaDevice(c).advertise();
    assertEquals(advertised.getString("channel"), toHex(own.channel));
    assertEquals(advertised.getString("mask"), toHex(own.mask));
  }

  @Test
  public void shamirCombinesPythonsSharesAndRefusesTooFew() throws Exception {
    JSONObject s = caseJson().getJSONObject("shamir");
    List<Shamir.Share> shares = new ArrayList<>();
    for (String h : strings(s.getJSONArray("shares"))) {
      shares.add(Shamir.Share.fromBytes(hex(h)));
    }
    int t = s.getInt("threshold");
    assertEquals(s.getString("secret"), toHex(Shamir.combine(shares.subList(2, 2 + t), t)));
    assertThrows(IllegalArgumentException.class, () -> Shamir.combine(shares.subList(0, t - 1), t));
    assertThrows(IllegalArgumentException.class, () -> Shamir.combine(shares.subList(0, t - 1), t - 1));
    byte[] secret = new byte[32];
    new SecureRandom().nextBytes(secret);
    List<Shamir.Share> own = Shamir.split(secret, 3, 6, new SecureRandom());
    assertArrayEquals(secret, Shamir.combine(Arrays.asList(own.get(5), own.get(0), own.get(3)), 3));
  }

  @Test
  public void encodesMasksAndAnswersAsPythonsSessionOfTheSameDevice() throws Exception {
    JSONObject c = caseJson();
    SecAggDevice device = javaDevice(c);
    device.shareKeys(neighbours(c), c.getInt("threshold"));
    Map<String, byte[]> sealed = new TreeMap<>();
    JSONObject forJava = c.getJSONObject("sealed_for_java");
    for (String name : forJava.keySet()) {
      sealed.put(name, hex(forJava.getString(name)));
    }
    device.receiveShares(sealed);
    JSONObject f = c.getJSONObject("fixed_point");
    JSONArray deltaJson = f.getJSONArray("delta");
    double[] delta = new double[deltaJson.length()];
    for (int i = 0; i < delta.length; i++) {
      delta[i] = deltaJson.getDouble(i);
    }
    FixedPoint fixed = new FixedPoint(f.getDouble("clip"), f.getInt("cohort"), f.getLong("weight_cap"));
    int[] encoded = fixed.encode(delta, f.getLong("num_samples"));
    assertArrayEquals(words(c.getString("words")), encoded);
    assertArrayEquals(words(c.getString("masked")), device.maskedInput(encoded));
    JSONObject unmask = c.getJSONObject("unmask");
    List<String> dropped = strings(unmask.getJSONArray("dropped"));
    List<String> survivors = strings(unmask.getJSONArray("survivors"));
    Map<String, byte[]> answer = device.unmask(dropped, survivors);
    JSONObject want = unmask.getJSONObject("answer");
    assertEquals(want.length(), answer.size());
    for (String name : want.keySet()) {
      assertEquals(name, want.getString(name), toHex(answer.get(name)));
    }
    // A malicious server: both secrets of one device, then a different second request.
    assertThrows(SecAggDevice.RefusedException.class, () -> device.unmask(List.of("z-2"), List.of("z-2")));
    assertThrows(SecAggDevice.RefusedException.class, () -> device.unmask(List.of(), List.of("a-1", "z-1", "z-2")));
    assertEquals(answer.keySet(), device.unmask(dropped, survivors).keySet()); // the same one again
  }

  @Test
  public void sharesItSealsOpenInPythonAndGiveBackItsSecrets() throws Exception {
    JSONObject c = caseJson();
    Map<String, byte[]> sealed = javaDevice(c).shareKeys(neighbours(c), c.getInt("threshold"));
    JSONObject out = new JSONObject();
    for (Map.Entry<String, byte[]> e : sealed.entrySet()) {
      out.put(e.getKey(), toHex(e.getValue()));
    }
    Path file = tmp.getRoot().toPath().resolve("java_sealed.json");
    Files.write(file, out.toString().getBytes(StandardCharsets.UTF_8));
    Process p = new ProcessBuilder(HostFixtures.python(), HostFixtures.script().toString(), "verify-secagg",
        file.toString()).redirectErrorStream(true).start();
    String said = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals("Python's sessions disagree: " + said, 0, p.waitFor());
  }

  @Test
  public void refusesWhatCouldTrickIt() throws Exception {
    JSONObject c = caseJson();
    Map<String, SecAggDevice.Advertisement> n = neighbours(c);
    Map<String, SecAggDevice.Advertisement> twice = new TreeMap<>(n);
    twice.put("z-2", n.get("z-1"));
    assertThrows(SecAggDevice.RefusedException.class, () -> javaDevice(c).shareKeys(twice, 2));
    assertThrows(SecAggDevice.RefusedException.class, () -> javaDevice(c).shareKeys(n, 4));
    SecAggDevice device = javaDevice(c);
    device.shareKeys(n, 2);
    Map<String, byte[]> wrong = new TreeMap<>();
    byte[] forA = hex(c.getJSONObject("sealed_for_java").getString("a-1"));
    wrong.put("z-1", forA); // a-1's message rerouted as z-1's: its authentication fails
    assertThrows(GeneralSecurityException.class, () -> device.receiveShares(wrong));
    byte[] lowOrder = new byte[32];
    assertThrows(GeneralSecurityException.class,
        () -> SecAggCrypto.agree(hex(c.getJSONObject("java").getString("mask")), lowOrder, SecAggCrypto.MASK,
            new byte[0]));
    assertTrue(SecAggCrypto.supported());
  }
}
