package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.json.JSONObject;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The Java core's SecAgg+ device (revision 1.7, docs/SECAGG.md) beyond the known-answer vectors
 * (SecAggVectorsTest): what it seals with its own random coefficients and nonces opens in Python's
 * sessions and gives back its secrets; a neighbour's message that does not open or parse costs
 * that pair its mask, not the round; and it refuses what a malicious server could use against it.
 */
public class SecAggTest {
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final byte[] SESSION = "0123456789abcdef0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  // --- Java -> Python: host_fixtures.py writes secagg/case.json and verifies what Java sealed ---

  private static JSONObject caseJson() throws Exception {
    Path file = HostFixtures.dir().resolve("secagg").resolve("case.json");
    return new JSONObject(new String(Files.readAllBytes(file), StandardCharsets.UTF_8));
  }

  private static byte[] hex(String s) {
    return SecAggCrypto.hex(s);
  }

  @Test
  public void sharesItSealsOpenInPythonAndGiveBackItsSecrets() throws Exception {
    JSONObject c = caseJson();
    JSONObject secrets = c.getJSONObject("java");
    SecAggDevice device = new SecAggDevice("java", c.getString("session").getBytes(StandardCharsets.US_ASCII),
        hex(secrets.getString("channel")), hex(secrets.getString("mask")), hex(secrets.getString("seed")),
        SecAggRandom.secure(RANDOM));
    Map<String, SecAggDevice.Advertisement> neighbours = new TreeMap<>();
    JSONObject ads = c.getJSONObject("advertised");
    for (String name : ads.keySet()) {
      JSONObject a = ads.getJSONObject(name);
      SecAggDevice.Advertisement keys =
          new SecAggDevice.Advertisement(hex(a.getString("channel")), hex(a.getString("mask")));
      if (name.equals("java")) {
        assertArrayEquals(keys.mask, device.advertise().mask);
      } else {
        neighbours.put(name, keys);
      }
    }
    Map<String, byte[]> sealed = device.shareKeys(neighbours, c.getInt("threshold"));
    JSONObject out = new JSONObject();
    for (Map.Entry<String, byte[]> e : sealed.entrySet()) {
      assertEquals(SecAggDevice.SEALED_BYTES, e.getValue().length);
      out.put(e.getKey(), SecAggVectorsTest.toHex(e.getValue()));
    }
    Path file = tmp.getRoot().toPath().resolve("java_sealed.json");
    Files.write(file, out.toString().getBytes(StandardCharsets.UTF_8));
    Process p = new ProcessBuilder(HostFixtures.python(), HostFixtures.script().toString(), "verify-secagg",
        file.toString()).redirectErrorStream(true).start();
    String said = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals("Python's sessions disagree: " + said, 0, p.waitFor());
  }

  // --- Java devices with fresh keys, everyone each other's neighbour ----------------------------

  /** A device of a test round whose keys and seed the test keeps, to check from outside what it did. */
  private static final class Peer {
    final String id;
    final byte[] channel;
    final byte[] mask;
    final byte[] seed = new byte[32];

    Peer(String id) throws GeneralSecurityException {
      this.id = id;
      this.channel = SecAggCrypto.generatePrivate(RANDOM);
      this.mask = SecAggCrypto.generatePrivate(RANDOM);
      RANDOM.nextBytes(seed);
    }

    SecAggDevice device() {
      return new SecAggDevice(id, SESSION, channel, mask, seed, SecAggRandom.secure(RANDOM));
    }

    SecAggDevice.Advertisement keys() throws GeneralSecurityException {
      return device().advertise();
    }
  }

  private static Map<String, Peer> peers(String... ids) throws GeneralSecurityException {
    Map<String, Peer> out = new TreeMap<>();
    for (String id : ids) {
      out.put(id, new Peer(id));
    }
    return out;
  }

  /** What the server relays to id in the key stage: everyone else's keys. */
  private static Map<String, SecAggDevice.Advertisement> othersOf(Map<String, Peer> peers, String id)
      throws GeneralSecurityException {
    Map<String, SecAggDevice.Advertisement> out = new TreeMap<>();
    for (Peer p : peers.values()) {
      if (!p.id.equals(id)) {
        out.put(p.id, p.keys());
      }
    }
    return out;
  }

  /** What each peer sealed for each other one (sender, then receiver), threshold t. */
  private static Map<String, Map<String, byte[]>> sealAll(Map<String, Peer> peers, int t)
      throws GeneralSecurityException {
    Map<String, Map<String, byte[]>> out = new TreeMap<>();
    for (Peer p : peers.values()) {
      out.put(p.id, p.device().shareKeys(othersOf(peers, p.id), t));
    }
    return out;
  }

  /** The device of id with its key stage done (threshold t), ready to receive shares. */
  private static SecAggDevice sharing(Map<String, Peer> peers, String id, int t) throws GeneralSecurityException {
    SecAggDevice device = peers.get(id).device();
    device.shareKeys(othersOf(peers, id), t);
    return device;
  }

  private static int[] minus(int[] a, int[] mask, int sign) {
    int[] out = a.clone();
    for (int k = 0; k < out.length; k++) {
      out[k] -= sign * mask[k]; // mod 2^32
    }
    return out;
  }

  /** The pair's mask seed as the other device derives it (its mask key, our public one). */
  private static int[] pairMask(Peer other, Peer own, int words) throws GeneralSecurityException {
    byte[] seed = SecAggCrypto.agree(other.mask, own.keys().mask, SecAggCrypto.MASK, SESSION);
    return SecAggCrypto.expand(seed, words);
  }

  @Test
  public void aNeighbourWhoseMessageDoesNotOpenIsUnopenedAndGetsNoPairwiseMask() throws Exception {
    Map<String, Peer> peers = peers("a", "m", "x", "z");
    Map<String, Map<String, byte[]>> sealed = sealAll(peers, 2);
    SecAggDevice m = sharing(peers, "m", 2);
    Map<String, byte[]> forM = new TreeMap<>();
    forM.put("a", sealed.get("a").get("m"));
    forM.put("z", sealed.get("z").get("m"));
    forM.put("x", sealed.get("x").get("a")); // x's message for a, rerouted: its authentication fails
    m.receiveShares(forM);
    assertEquals(List.of("x"), m.unopened());

    int[] words = {7, -3, 0, Integer.MAX_VALUE, Integer.MIN_VALUE, 12345};
    int[] masked = m.maskedInput(words);
    // Take off the self mask and the masks of the pairs m holds: a < m (m subtracted it), m < z
    // (m added it). What is left is the words: m added nothing for x.
    int[] left = minus(masked, SecAggCrypto.expand(peers.get("m").seed, words.length), 1);
    left = minus(left, pairMask(peers.get("a"), peers.get("m"), words.length), -1);
    left = minus(left, pairMask(peers.get("z"), peers.get("m"), words.length), 1);
    assertArrayEquals(words, left);

    // It holds no share of x: a request about x is refused; one about a and z is answered.
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of("x"), List.of("a", "z")));
    assertEquals(List.of("a", "z"), List.copyOf(m.unmask(List.of(), List.of("a", "z")).keySet()));
  }

  /** A share's 68 bytes for any index and value (even ones Shamir.Share refuses to hold). */
  private static byte[] share(int index, BigInteger value) {
    byte[] out = new byte[Shamir.SHARE_BYTES];
    out[0] = (byte) (index >>> 8);
    out[1] = (byte) index;
    byte[] v = value.toByteArray();
    int copy = Math.min(v.length, Shamir.VALUE_BYTES);
    System.arraycopy(v, v.length - copy, out, Shamir.SHARE_BYTES - copy, copy);
    return out;
  }

  private static byte[] concat(byte[] a, byte[] b) {
    byte[] out = Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }

  /** plaintext sealed by x for m as a device would, under their channel key and associated data. */
  private static byte[] sealFromXToM(Map<String, Peer> peers, byte[] plaintext, byte[] session)
      throws GeneralSecurityException {
    byte[] key = SecAggCrypto.agree(peers.get("x").channel, peers.get("m").keys().channel, SecAggCrypto.CHANNEL,
        session);
    byte[] nonce = new byte[SecAggCrypto.NONCE_BYTES];
    RANDOM.nextBytes(nonce);
    return SecAggCrypto.encrypt(key, nonce, plaintext, SecAggDevice.associatedData(session, "x", "m"));
  }

  @Test
  public void everyMessageThatDoesNotOpenOrParseIsUnopened() throws Exception {
    Map<String, Peer> peers = peers("a", "m", "x", "z");
    Map<String, Map<String, byte[]>> sealed = sealAll(peers, 2);
    BigInteger p = Shamir.PRIME;
    BigInteger v = BigInteger.valueOf(123456789);
    Map<String, byte[]> bad = new LinkedHashMap<>();
    bad.put("rerouted", sealed.get("x").get("a"));
    bad.put("truncated", Arrays.copyOf(sealed.get("x").get("m"), 100));
    bad.put("too short to hold a nonce and a tag", new byte[20]);
    bad.put("random bytes", new byte[SecAggDevice.SEALED_BYTES]);
    byte[] good = concat(share(2, v), share(2, v.add(BigInteger.ONE)));
    bad.put("135 bytes", sealFromXToM(peers, Arrays.copyOf(good, 135), SESSION));
    bad.put("137 bytes", sealFromXToM(peers, Arrays.copyOf(good, 137), SESSION));
    bad.put("index 0", sealFromXToM(peers, concat(share(0, v), share(0, v)), SESSION));
    bad.put("a value of p", sealFromXToM(peers, concat(share(2, p), share(2, v)), SESSION));
    bad.put("a value above p", sealFromXToM(peers, concat(share(2, v), share(2, p.add(v))), SESSION));
    bad.put("different indices", sealFromXToM(peers, concat(share(2, v), share(3, v)), SESSION));
    bad.put("another round's", sealFromXToM(peers, good, "ffffffffffffffffffffffffffffffff".getBytes(
        StandardCharsets.US_ASCII)));
    for (Map.Entry<String, byte[]> e : bad.entrySet()) {
      SecAggDevice m = sharing(peers, "m", 2);
      Map<String, byte[]> forM = new TreeMap<>();
      forM.put("a", sealed.get("a").get("m"));
      forM.put("z", sealed.get("z").get("m"));
      forM.put("x", e.getValue());
      m.receiveShares(forM);
      assertEquals(e.getKey(), List.of("x"), m.unopened());
    }
    // The control: the same hand-made message, well formed, opens and is held.
    SecAggDevice m = sharing(peers, "m", 2);
    Map<String, byte[]> forM = new TreeMap<>();
    forM.put("a", sealed.get("a").get("m"));
    forM.put("z", sealed.get("z").get("m"));
    forM.put("x", sealFromXToM(peers, good, SESSION));
    m.receiveShares(forM);
    assertEquals(List.of(), m.unopened());
    assertArrayEquals(share(2, v), m.unmask(List.of(), List.of("x")).get("x"));
  }

  @Test
  public void refusesAKeyListThatCouldTrickIt() throws Exception {
    Map<String, Peer> peers = peers("a", "m", "x", "z");
    Map<String, SecAggDevice.Advertisement> others = othersOf(peers, "m");
    SecAggDevice.Advertisement own = peers.get("m").keys();
    SecAggDevice.Advertisement a = others.get("a");
    Map<String, Map<String, SecAggDevice.Advertisement>> tricks = new LinkedHashMap<>();
    tricks.put("names the device itself", with(others, "m", own));
    tricks.put("two devices with the same keys", with(others, "z", a));
    tricks.put("one device's channel key is another's mask key",
        with(others, "z", new SecAggDevice.Advertisement(others.get("z").channel, a.channel)));
    tricks.put("a device with its channel key as its mask key",
        with(others, "a", new SecAggDevice.Advertisement(a.channel, a.channel)));
    tricks.put("a device with this device's own mask key",
        with(others, "a", new SecAggDevice.Advertisement(a.channel, own.mask)));
    tricks.put("a device with this device's own channel key",
        with(others, "a", new SecAggDevice.Advertisement(own.channel, a.mask)));
    for (Map.Entry<String, Map<String, SecAggDevice.Advertisement>> e : tricks.entrySet()) {
      assertThrows(e.getKey(), SecAggDevice.RefusedException.class, () -> peers.get("m").device().shareKeys(
          e.getValue(), 2));
    }
    assertThrows(SecAggDevice.RefusedException.class, () -> peers.get("m").device().shareKeys(others, 4));
    assertThrows(SecAggDevice.RefusedException.class, () -> peers.get("m").device().shareKeys(others, 0));
    // 2t <= k: a server lying about who dropped could collect t shares of both secrets.
    assertThrows(SecAggDevice.RefusedException.class, () -> peers.get("m").device().shareKeys(others, 1));
    assertEquals(3, peers.get("m").device().shareKeys(others, 3).size()); // and the honest list is taken
    assertTrue(SecAggCrypto.supported());
  }

  private static Map<String, SecAggDevice.Advertisement> with(Map<String, SecAggDevice.Advertisement> keys,
      String id, SecAggDevice.Advertisement advertised) {
    Map<String, SecAggDevice.Advertisement> out = new TreeMap<>(keys);
    out.put(id, advertised);
    return out;
  }

  @Test
  public void refusesAMessageFromANonNeighbourAndFewerThanTheThresholdThatOpen() throws Exception {
    Map<String, Peer> peers = peers("a", "m", "x", "z");
    Map<String, Map<String, byte[]>> sealed = sealAll(peers, 3);
    Map<String, byte[]> forM = new TreeMap<>();
    for (String sender : List.of("a", "x", "z")) {
      forM.put(sender, sealed.get(sender).get("m"));
    }
    Map<String, byte[]> stranger = new TreeMap<>(forM);
    stranger.put("q", sealed.get("x").get("m"));
    assertThrows(SecAggDevice.RefusedException.class, () -> sharing(peers, "m", 3).receiveShares(stranger));
    Map<String, byte[]> oneBroken = new TreeMap<>(forM);
    oneBroken.put("z", sealed.get("z").get("a"));
    // t = 3 of 3: one neighbour's message that does not open leaves too few to take part.
    assertThrows(SecAggDevice.RefusedException.class, () -> sharing(peers, "m", 3).receiveShares(oneBroken));
    sharing(peers, "m", 3).receiveShares(forM);
  }

  @Test
  public void refusesAMaliciousUnmaskingRequest() throws Exception {
    Map<String, Peer> peers = peers("a", "m", "x", "z");
    Map<String, Map<String, byte[]>> sealed = sealAll(peers, 2);
    SecAggDevice m = sharing(peers, "m", 2);
    Map<String, byte[]> forM = new TreeMap<>();
    for (String sender : List.of("a", "x", "z")) {
      forM.put(sender, sealed.get(sender).get("m"));
    }
    m.receiveShares(forM);
    // Both secrets of one device; a device it holds no share of (itself, a stranger).
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of("z"), List.of("z")));
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of("m"), List.of("a")));
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of(), List.of("a", "q")));
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of(), List.of("a", "a")));
    Map<String, byte[]> answer = m.unmask(List.of("z"), List.of("a", "x"));
    assertEquals(List.of("a", "x", "z"), List.copyOf(answer.keySet()));
    // A second, different request (z's seed now): refused; the same one again is answered again.
    assertThrows(SecAggDevice.RefusedException.class, () -> m.unmask(List.of(), List.of("a", "x", "z")));
    assertEquals(answer.keySet(), m.unmask(List.of("z"), List.of("a", "x")).keySet());
  }
}
