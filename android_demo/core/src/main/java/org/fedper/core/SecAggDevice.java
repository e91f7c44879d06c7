package org.fedper.core;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * A device's side of one SecAgg+ round (protocol revision 1.7), as
 * fedper/common/secagg/device_session.py; docs/SECAGG.md, "To the byte", defines every byte: its
 * keys and self-mask seed, the shares it seals for its neighbours, the masked input, and the one
 * unmasking answer it gives. It trusts the server to route, not to be honest: it refuses a key
 * list or a request that could trick it into giving a secret away. A neighbour's message that does
 * not open does not end its round: it holds no share of that neighbour, adds no pairwise mask with
 * it and lists it as unopened, so that the server leaves the pair out consistently. Device ids are
 * compared as Java strings (the protocol's ids are ASCII, where that is byte order too).
 */
public final class SecAggDevice {
  /** The sealed message's plaintext: a share of the seed, then one of the mask key (same index). */
  public static final int PLAINTEXT_BYTES = 2 * Shamir.SHARE_BYTES;
  /** nonce || ciphertext || tag: 164 bytes. */
  public static final int SEALED_BYTES = SecAggCrypto.NONCE_BYTES + PLAINTEXT_BYTES + SecAggCrypto.TAG_BYTES;
  private static final byte[] SHARE_LABEL = "fedper secagg share".getBytes(StandardCharsets.US_ASCII);

  /** What the server asked would break the protocol; the device does not answer it. */
  public static final class RefusedException extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    RefusedException(String message) {
      super(message);
    }

    RefusedException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** A device's two public keys for the round. */
  public static final class Advertisement {
    public final byte[] channel;
    public final byte[] mask;

    public Advertisement(byte[] channel, byte[] mask) {
      this.channel = channel.clone();
      this.mask = mask.clone();
    }
  }

  /** What a neighbour sent this device: a share of its self-mask seed and of its mask key. */
  private static final class Held {
    final Shamir.Share seed;
    final Shamir.Share maskKey;

    Held(Shamir.Share seed, Shamir.Share maskKey) {
      this.seed = seed;
      this.maskKey = maskKey;
    }
  }

  public final String deviceId;
  private final byte[] context;
  private final byte[] channelKey;
  private final byte[] maskKey;
  private final byte[] seed;
  private final SecAggRandom random;
  private Map<String, Advertisement> neighbours = new TreeMap<>();
  private int threshold;
  private final Map<String, Held> held = new TreeMap<>();
  private final Set<String> unopened = new TreeSet<>();
  private Set<String> answeredDropped;
  private Set<String> answeredSurvivors;

  /** Fresh keys, seed, coefficients and nonces: a real round. */
  public SecAggDevice(String deviceId, byte[] context, SecureRandom random) throws GeneralSecurityException {
    this(deviceId, context, SecAggCrypto.generatePrivate(random), SecAggCrypto.generatePrivate(random),
        seed(random), SecAggRandom.secure(random));
  }

  /**
   * Given keys, seed and randomness: the tests (the known-answer vectors fix all four). context
   * is the task's secagg.session as ASCII bytes.
   */
  public SecAggDevice(String deviceId, byte[] context, byte[] channelKey, byte[] maskKey, byte[] seed,
      SecAggRandom random) {
    this.deviceId = deviceId;
    this.context = context.clone();
    this.channelKey = channelKey.clone();
    this.maskKey = maskKey.clone();
    this.seed = seed.clone();
    this.random = random;
  }

  private static byte[] seed(SecureRandom random) {
    byte[] s = new byte[SecAggCrypto.KEY_BYTES];
    random.nextBytes(s);
    return s;
  }

  public Advertisement advertise() throws GeneralSecurityException {
    return new Advertisement(SecAggCrypto.publicFromPrivate(channelKey), SecAggCrypto.publicFromPrivate(maskKey));
  }

  /**
   * Shares of the self-mask seed and the mask key, one per neighbour, each sealed for it (receiver
   * id to 164 bytes). Refused: a list that names this device, is shorter than the threshold or
   * at least twice as long (2t <= k), or
   * holds an invalid key or two equal keys, this device's own included (only a server that skips
   * its checks could send one).
   */
  public Map<String, byte[]> shareKeys(Map<String, Advertisement> neighbourKeys, int threshold)
      throws GeneralSecurityException {
    if (neighbourKeys.containsKey(deviceId)) {
      throw new RefusedException("the server listed this device as its own neighbour");
    }
    if (threshold < 1 || neighbourKeys.size() < threshold) {
      throw new RefusedException(neighbourKeys.size() + " neighbours cannot hold shares " + threshold + " of n");
    }
    if (2 * threshold <= neighbourKeys.size()) {
      // With 2t <= k, a server that tells some holders this device dropped and the others that it
      // survived could collect t shares of both of its secrets (docs/SECAGG.md, "A round").
      throw new RefusedException("a threshold of " + threshold + " among " + neighbourKeys.size()
          + " neighbours is not more than half: the server could collect both secrets");
    }
    List<byte[]> keys = new ArrayList<>();
    for (Advertisement a : neighbourKeys.values()) {
      keys.add(a.channel);
      keys.add(a.mask);
    }
    Advertisement own = advertise();
    keys.add(own.channel);
    keys.add(own.mask);
    checkKeys(keys);
    this.neighbours = new TreeMap<>(neighbourKeys);
    this.threshold = threshold;
    List<String> order = new ArrayList<>(this.neighbours.keySet());
    // The vectors' order of draws: the seed's coefficients, the mask key's, then one nonce per receiver.
    List<Shamir.Share> seedShares = Shamir.split(seed, threshold, order.size(), random::coefficient);
    List<Shamir.Share> keyShares = Shamir.split(maskKey, threshold, order.size(), random::coefficient);
    Map<String, byte[]> out = new LinkedHashMap<>();
    for (int i = 0; i < order.size(); i++) {
      String name = order.get(i);
      byte[] key = SecAggCrypto.agree(channelKey, this.neighbours.get(name).channel, SecAggCrypto.CHANNEL, context);
      byte[] plaintext = pack(seedShares.get(i), keyShares.get(i));
      out.put(name, SecAggCrypto.encrypt(key, random.nonce(), plaintext, associated(deviceId, name)));
    }
    return out;
  }

  /** Every key valid (SecAggCrypto.checkPublic) and no two equal, across both roles. */
  private static void checkKeys(List<byte[]> keys) {
    Set<String> seen = new HashSet<>();
    for (byte[] k : keys) {
      try {
        SecAggCrypto.checkPublic(k);
      } catch (GeneralSecurityException e) {
        throw new RefusedException("the key list: " + e.getMessage(), e);
      }
      if (!seen.add(Arrays.toString(k))) {
        throw new RefusedException("the key list: two keys of the round are the same");
      }
    }
  }

  /**
   * Keeps the shares the neighbours sealed for this device (sender id to sealed message). One that
   * does not open, is not 136 bytes, has a share of index 0 or a value outside the field, or two
   * shares of different indices is unopened: no share of that sender is kept, so no pairwise mask
   * is added with it (unopened() lists it). Refused: a message from a device that is not a
   * neighbour (only a malicious server relays one), or fewer senders held than the threshold.
   */
  public void receiveShares(Map<String, byte[]> sealed) {
    for (Map.Entry<String, byte[]> e : new TreeMap<>(sealed).entrySet()) {
      String sender = e.getKey();
      Advertisement a = neighbours.get(sender);
      if (a == null) {
        throw new RefusedException("shares from '" + sender + "', who is not a neighbour");
      }
      try {
        byte[] key = SecAggCrypto.agree(channelKey, a.channel, SecAggCrypto.CHANNEL, context);
        held.put(sender, unpack(SecAggCrypto.decrypt(key, e.getValue(), associated(sender, deviceId))));
      } catch (GeneralSecurityException | IllegalArgumentException notOpened) {
        unopened.add(sender);
      }
    }
    if (held.size() < threshold) {
      throw new RefusedException("only " + held.size() + " neighbours sent shares that open; the round needs "
          + threshold);
    }
  }

  /** The neighbours whose messages did not open, in id order (the masked input's header lists them). */
  public List<String> unopened() {
    return Collections.unmodifiableList(new ArrayList<>(unopened));
  }

  /**
   * The words plus, mod 2^32, the self mask and the pairwise masks with the neighbours whose shares
   * it holds: added when its id is below the neighbour's, subtracted when above.
   */
  public int[] maskedInput(int[] words) throws GeneralSecurityException {
    int[] masked = words.clone();
    add(masked, SecAggCrypto.expand(seed, words.length), 1);
    for (String other : held.keySet()) {
      byte[] pairSeed = SecAggCrypto.agree(maskKey, neighbours.get(other).mask, SecAggCrypto.MASK, context);
      add(masked, SecAggCrypto.expand(pairSeed, words.length), deviceId.compareTo(other) < 0 ? 1 : -1);
    }
    return masked;
  }

  /**
   * The mask-key shares of the dropped neighbours and the seed shares of the surviving ones.
   * Refused: a device named as both, one it holds no share of, or a second, different request.
   */
  public Map<String, byte[]> unmask(List<String> dropped, List<String> survivors) {
    Set<String> d = new TreeSet<>(dropped);
    Set<String> s = new TreeSet<>(survivors);
    if (d.size() != dropped.size() || s.size() != survivors.size()) {
      throw new RefusedException("the unmasking request names a device twice");
    }
    Set<String> both = new TreeSet<>(d);
    both.retainAll(s);
    if (!both.isEmpty()) {
      throw new RefusedException("asked for both secrets of " + both);
    }
    Set<String> unknown = new TreeSet<>(d);
    unknown.addAll(s);
    unknown.removeAll(held.keySet());
    if (!unknown.isEmpty()) {
      throw new RefusedException("asked about " + unknown + ", of whom this device holds no share");
    }
    if (answeredDropped != null && !(answeredDropped.equals(d) && answeredSurvivors.equals(s))) {
      throw new RefusedException("the round's unmasking was already answered with other lists");
    }
    answeredDropped = d;
    answeredSurvivors = s;
    Map<String, byte[]> answer = new TreeMap<>();
    for (String name : d) {
      answer.put(name, held.get(name).maskKey.toBytes());
    }
    for (String name : s) {
      answer.put(name, held.get(name).seed.toBytes());
    }
    return answer;
  }

  private static void add(int[] into, int[] mask, int sign) {
    for (int k = 0; k < into.length; k++) {
      into[k] += sign * mask[k]; // int arithmetic wraps mod 2^32, as uint32 does
    }
  }

  private byte[] associated(String sender, String receiver) {
    return associatedData(context, sender, receiver);
  }

  /**
   * A sealed message's associated data: "fedper secagg share", the round's session, who sealed
   * it and for whom, 0x00 between; binding them is what makes a rerouted or replayed message fail
   * to open.
   */
  static byte[] associatedData(byte[] context, String sender, String receiver) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    byte[][] parts = {SHARE_LABEL, context, sender.getBytes(StandardCharsets.US_ASCII),
        receiver.getBytes(StandardCharsets.US_ASCII)};
    for (int i = 0; i < parts.length; i++) {
      if (i > 0) {
        out.write(0);
      }
      out.write(parts[i], 0, parts[i].length);
    }
    return out.toByteArray();
  }

  static byte[] pack(Shamir.Share seedShare, Shamir.Share keyShare) {
    return SecAggCrypto.concat(seedShare.toBytes(), keyShare.toBytes());
  }

  /** The two shares of a plaintext; IllegalArgumentException when it is not what pack gives. */
  private static Held unpack(byte[] data) {
    if (data.length != PLAINTEXT_BYTES) {
      throw new IllegalArgumentException("a share message is " + PLAINTEXT_BYTES + " bytes, got " + data.length);
    }
    Held h = new Held(Shamir.Share.fromBytes(Arrays.copyOfRange(data, 0, Shamir.SHARE_BYTES)),
        Shamir.Share.fromBytes(Arrays.copyOfRange(data, Shamir.SHARE_BYTES, data.length)));
    if (h.seed.index != h.maskKey.index) {
      throw new IllegalArgumentException("the two shares have different indices");
    }
    return h;
  }
}
