package org.fedper.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.security.InvalidKeyException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The Java core against docs/secagg_vectors.json, protocol revision 1.7's known-answer vectors
 * (docs/SECAGG.md, "To the byte"; written by docs/scripts/secagg_vectors.py): every device-side
 * vector, down to a whole round of four devices whose coefficients and nonces are injected, so
 * that the Java device's sealed messages, masked inputs and unmasking answers are the vectors'
 * bytes. (The "resolution" vectors are the server's: who is left out of the sum.)
 */
public class SecAggVectorsTest {
  private static JSONObject vectors;
  private static byte[] session;

  @BeforeClass
  public static void read() throws Exception {
    vectors = new JSONObject(new String(Files.readAllBytes(HostFixtures.vectors()), StandardCharsets.UTF_8));
    assertTrue(vectors.getString("about"), vectors.getString("about").contains("revision 1.7"));
    session = vectors.getString("session").getBytes(StandardCharsets.US_ASCII);
  }

  /** The coefficients and nonces a vector lists, handed out in the order the device draws them. */
  static final class Fixed implements SecAggRandom {
    final Deque<BigInteger> coefficients = new ArrayDeque<>();
    final Deque<byte[]> nonces = new ArrayDeque<>();

    Fixed(JSONArray coefficientsHex, JSONArray noncesHex) throws Exception {
      for (int i = 0; i < coefficientsHex.length(); i++) {
        coefficients.add(new BigInteger(coefficientsHex.getString(i), 16));
      }
      for (int i = 0; noncesHex != null && i < noncesHex.length(); i++) {
        nonces.add(hex(noncesHex.getString(i)));
      }
    }

    @Override
    public BigInteger coefficient() {
      return coefficients.removeFirst(); // NoSuchElementException: the device drew more than the vector
    }

    @Override
    public byte[] nonce() {
      return nonces.removeFirst();
    }

    boolean used() {
      return coefficients.isEmpty() && nonces.isEmpty();
    }
  }

  static byte[] hex(String s) {
    return SecAggCrypto.hex(s);
  }

  static String toHex(byte[] b) {
    StringBuilder out = new StringBuilder();
    for (byte x : b) {
      out.append(String.format("%02x", x & 0xFF));
    }
    return out.toString();
  }

  /** uint32 words as their little-endian bytes, in hex (the vectors' form). */
  static String wordsHex(int[] words) {
    ByteBuffer out = ByteBuffer.allocate(4 * words.length).order(ByteOrder.LITTLE_ENDIAN);
    out.asIntBuffer().put(words);
    return toHex(out.array());
  }

  private static double[] doubles(JSONArray a) throws Exception {
    double[] out = new double[a.length()];
    for (int i = 0; i < out.length; i++) {
      out[i] = a.getDouble(i);
    }
    return out;
  }

  private static List<String> strings(JSONArray a) throws Exception {
    List<String> out = new ArrayList<>();
    for (int i = 0; i < a.length(); i++) {
      out.add(a.getString(i));
    }
    return out;
  }

  @Test
  public void publicKeysFromPrivateKeys() throws Exception {
    JSONArray pairs = vectors.getJSONObject("keys").getJSONArray("pairs");
    for (int i = 0; i < pairs.length(); i++) {
      JSONObject pair = pairs.getJSONObject(i);
      byte[] pub = SecAggCrypto.publicFromPrivate(hex(pair.getString("private")));
      assertEquals(pair.getString("public"), toHex(pub));
      SecAggCrypto.checkPublic(pub); // valid
    }
  }

  @Test
  public void everyInvalidPublicKeyIsRefusedAndSoIsAKeyListHoldingIt() throws Exception {
    JSONArray invalid = vectors.getJSONObject("keys").getJSONArray("invalid_public_keys");
    assertEquals(8, invalid.length());
    JSONObject round = vectors.getJSONObject("round").getJSONObject("devices");
    for (int i = 0; i < invalid.length(); i++) {
      String why = invalid.getJSONObject(i).getString("why");
      byte[] key = hex(invalid.getJSONObject(i).getString("key"));
      assertThrows(why, InvalidKeyException.class, () -> SecAggCrypto.checkPublic(key));
      for (boolean asMask : new boolean[] {false, true}) { // in either role, the device sits the round out
        Map<String, SecAggDevice.Advertisement> keys = neighbourKeys("d-0");
        SecAggDevice.Advertisement d1 = keys.get("d-1");
        keys.put("d-1", asMask ? new SecAggDevice.Advertisement(d1.channel, key)
            : new SecAggDevice.Advertisement(key, d1.mask));
        SecAggDevice device = device("d-0", round.getJSONObject("d-0"));
        assertThrows(why, SecAggDevice.RefusedException.class, () -> device.shareKeys(keys, 2));
      }
    }
  }

  @Test
  public void bothDerivations() throws Exception {
    JSONArray agreement = vectors.getJSONArray("agreement");
    assertEquals(2, agreement.length());
    for (int i = 0; i < agreement.length(); i++) {
      JSONObject a = agreement.getJSONObject(i);
      byte[] own = hex(a.getString("own_private"));
      byte[] theirs = hex(a.getString("their_public"));
      String purpose = a.getString("purpose");
      assertEquals("", a.getString("salt")); // no salt: HKDF's zero key
      assertEquals(a.getString("x25519"), toHex(SecAggCrypto.exchange(own, theirs)));
      assertEquals(a.getString("info"), toHex(SecAggCrypto.info(purpose, session)));
      assertEquals(purpose, a.getString("key"), toHex(SecAggCrypto.agree(own, theirs, purpose, session)));
    }
    assertEquals(SecAggCrypto.CHANNEL, agreement.getJSONObject(0).getString("purpose"));
    assertEquals(SecAggCrypto.MASK, agreement.getJSONObject(1).getString("purpose"));
  }

  @Test
  public void theMaskGenerator() throws Exception {
    JSONArray prg = vectors.getJSONArray("prg");
    for (int i = 0; i < prg.length(); i++) {
      JSONObject p = prg.getJSONObject(i);
      assertEquals(p.getString("output"), wordsHex(SecAggCrypto.expand(hex(p.getString("seed")), p.getInt("words"))));
    }
  }

  @Test
  public void shamirSplitsWithTheGivenCoefficientsAndAnyThresholdPutsItTogether() throws Exception {
    JSONObject s = vectors.getJSONObject("shamir");
    int t = s.getInt("threshold");
    Fixed coefficients = new Fixed(s.getJSONArray("coefficients"), null);
    byte[] secret = hex(s.getString("secret"));
    List<Shamir.Share> shares = Shamir.split(secret, t, s.getInt("holders"), coefficients::coefficient);
    assertTrue(coefficients.used());
    List<String> got = new ArrayList<>();
    for (Shamir.Share share : shares) {
      got.add(toHex(share.toBytes()));
    }
    assertEquals(strings(s.getJSONArray("shares")), got);
    int n = shares.size();
    int subsets = 0;
    for (int mask = 0; mask < 1 << n; mask++) {
      if (Integer.bitCount(mask) != t) {
        continue;
      }
      List<Shamir.Share> some = new ArrayList<>();
      for (int k = n - 1; k >= 0; k--) { // the indices in descending order: order does not matter
        if ((mask & 1 << k) != 0) {
          some.add(Shamir.Share.fromBytes(hex(got.get(k))));
        }
      }
      assertArrayEquals(secret, Shamir.combine(some, t));
      subsets++;
    }
    assertEquals(10, subsets); // 3 of 5
    assertThrows(IllegalArgumentException.class, () -> Shamir.combine(shares.subList(0, t - 1), t));
  }

  @Test
  public void theSealedMessage() throws Exception {
    JSONObject v = vectors.getJSONObject("sealed");
    byte[] key = SecAggCrypto.agree(hex(v.getString("sender_channel_private")),
        hex(v.getString("receiver_channel_public")), SecAggCrypto.CHANNEL, session);
    assertEquals(v.getString("key"), toHex(key));
    byte[] associated = SecAggDevice.associatedData(session, v.getString("sender"), v.getString("receiver"));
    assertEquals(v.getString("associated_data"), toHex(associated));
    byte[] plaintext = hex(v.getString("plaintext"));
    assertEquals(SecAggDevice.PLAINTEXT_BYTES, plaintext.length);
    Shamir.Share seedShare = Shamir.Share.fromBytes(Arrays.copyOfRange(plaintext, 0, Shamir.SHARE_BYTES));
    Shamir.Share keyShare = Shamir.Share.fromBytes(
        Arrays.copyOfRange(plaintext, Shamir.SHARE_BYTES, plaintext.length));
    assertArrayEquals(plaintext, SecAggDevice.pack(seedShare, keyShare));
    byte[] sealed = SecAggCrypto.encrypt(key, hex(v.getString("nonce")), plaintext, associated);
    assertEquals(v.getString("sealed"), toHex(sealed));
    assertEquals(SecAggDevice.SEALED_BYTES, sealed.length);
    assertArrayEquals(plaintext, SecAggCrypto.decrypt(key, sealed, associated));
  }

  @Test
  public void bothFixedPointEncodings() throws Exception {
    JSONArray cases = vectors.getJSONArray("fixed_point");
    assertEquals(2, cases.length());
    for (int i = 0; i < cases.length(); i++) {
      JSONObject f = cases.getJSONObject(i);
      FixedPoint fixed = new FixedPoint(f.getDouble("clip"), f.getInt("cohort"), f.getLong("weight_cap"),
          f.getInt("flag_words"));
      assertEquals(f.getLong("bound"), fixed.bound());
      assertEquals(f.getDouble("scale"), fixed.scale(), 0);
      JSONArray flagsJson = f.getJSONArray("flags");
      int[] flags = new int[flagsJson.length()];
      for (int k = 0; k < flags.length; k++) {
        flags[k] = flagsJson.getInt(k);
      }
      assertEquals(f.getString("words"),
          wordsHex(fixed.encode(doubles(f.getJSONArray("delta")), f.getLong("num_samples"), flags)));
    }
  }

  /** A round vector's device, with its keys, seed, coefficients and nonces. */
  private static SecAggDevice device(String name, JSONObject d) throws Exception {
    return new SecAggDevice(name, session, hex(d.getString("channel_private")), hex(d.getString("mask_private")),
        hex(d.getString("seed")), new Fixed(d.getJSONArray("coefficients"), d.getJSONArray("nonces")));
  }

  /** What the server relays to name in the key stage: its neighbours' public keys (the graph's). */
  private static Map<String, SecAggDevice.Advertisement> neighbourKeys(String name) throws Exception {
    JSONObject round = vectors.getJSONObject("round");
    Map<String, SecAggDevice.Advertisement> out = new TreeMap<>();
    for (String other : strings(round.getJSONObject("graph").getJSONArray(name))) {
      JSONObject d = round.getJSONObject("devices").getJSONObject(other);
      out.put(other, new SecAggDevice.Advertisement(hex(d.getString("channel_public")),
          hex(d.getString("mask_public"))));
    }
    return out;
  }

  @Test
  public void aWholeRoundGivesTheVectorsBytes() throws Exception {
    JSONObject round = vectors.getJSONObject("round");
    assertEquals(vectors.getString("session"), round.getString("session"));
    JSONObject devices = round.getJSONObject("devices");
    int t = round.getInt("threshold");
    List<String> names = new ArrayList<>(new TreeSet<>(devices.keySet()));
    List<String> dropped = strings(round.getJSONArray("dropped"));
    JSONObject e = round.getJSONObject("encoding");
    FixedPoint fixed = new FixedPoint(e.getDouble("clip"), e.getInt("cohort"), e.getLong("weight_cap"),
        e.getInt("flag_words"));
    Map<String, SecAggDevice> java = new TreeMap<>();
    Map<String, Fixed> draws = new TreeMap<>();
    // Keys, then shares: each device seals exactly the vector's messages.
    for (String name : names) {
      JSONObject d = devices.getJSONObject(name);
      Fixed drawn = new Fixed(d.getJSONArray("coefficients"), d.getJSONArray("nonces"));
      SecAggDevice device = new SecAggDevice(name, session, hex(d.getString("channel_private")),
          hex(d.getString("mask_private")), hex(d.getString("seed")), drawn);
      SecAggDevice.Advertisement own = device.advertise();
      assertEquals(d.getString("channel_public"), toHex(own.channel));
      assertEquals(d.getString("mask_public"), toHex(own.mask));
      Map<String, byte[]> sealed = device.shareKeys(neighbourKeys(name), t);
      assertTrue(name + " drew what the vector lists, no more, no less", drawn.used());
      JSONObject want = d.getJSONObject("sealed");
      assertEquals(new TreeSet<>(want.keySet()), sealed.keySet());
      for (Map.Entry<String, byte[]> s : sealed.entrySet()) {
        assertEquals(name + " for " + s.getKey(), want.getString(s.getKey()), toHex(s.getValue()));
      }
      java.put(name, device);
      draws.put(name, drawn);
    }
    // Each opens what its neighbours sealed for it (the dropped device shared its keys first).
    for (String name : names) {
      Map<String, byte[]> forIt = new TreeMap<>();
      for (String sender : neighbourKeys(name).keySet()) {
        forIt.put(sender, hex(devices.getJSONObject(sender).getJSONObject("sealed").getString(name)));
      }
      java.get(name).receiveShares(forIt);
      assertEquals(name, List.of(), java.get(name).unopened());
    }
    // The survivors' words and masked inputs, then their unmasking answers.
    Map<String, Map<String, byte[]>> answers = new TreeMap<>();
    int[] sumOfWords = null;
    for (String name : names) {
      JSONObject d = devices.getJSONObject(name);
      int[] words = fixed.encode(doubles(d.getJSONArray("delta")), d.getLong("num_samples"));
      assertEquals(name, d.getString("words"), wordsHex(words));
      if (dropped.contains(name)) {
        assertFalse(d.has("masked"));
        continue;
      }
      assertEquals(name, d.getString("masked"), wordsHex(java.get(name).maskedInput(words)));
      sumOfWords = sumOfWords == null ? words.clone() : add(sumOfWords, words);
      JSONObject request = d.getJSONObject("unmask_request");
      Map<String, byte[]> answer = java.get(name).unmask(strings(request.getJSONArray("dropped")),
          strings(request.getJSONArray("survivors")));
      JSONObject want = d.getJSONObject("unmask_answer");
      assertEquals(new TreeSet<>(want.keySet()), answer.keySet());
      for (Map.Entry<String, byte[]> a : answer.entrySet()) {
        assertEquals(name + " about " + a.getKey(), want.getString(a.getKey()), toHex(a.getValue()));
      }
      answers.put(name, answer);
    }
    assertEquals(round.getString("total"), wordsHex(sumOfWords)); // what the server's unmasking leaves
    // The answers put each secret together: the dropped device's mask key, the survivors' seeds.
    for (String about : names) {
      List<Shamir.Share> shares = new ArrayList<>();
      for (Map<String, byte[]> answer : answers.values()) {
        if (answer.containsKey(about)) {
          shares.add(Shamir.Share.fromBytes(answer.get(about)));
        }
      }
      String secret = dropped.contains(about) ? "mask_private" : "seed";
      assertEquals(about, devices.getJSONObject(about).getString(secret), toHex(Shamir.combine(shares, t)));
    }
  }

  private static int[] add(int[] a, int[] b) {
    int[] out = a.clone();
    for (int k = 0; k < out.length; k++) {
      out[k] += b[k]; // mod 2^32
    }
    return out;
  }
}
