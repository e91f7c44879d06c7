package org.fedper.core;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * A device's side of one SecAgg+ round, as fedper/common/secagg/device_session.py
 * (docs/SECAGG.md): its keys and self-mask seed, the shares it seals for its neighbours, the
 * masked input, and the one unmasking answer it gives. Device ids are compared as Java strings
 * (the protocol's ids are ASCII, where that is Python's order too).
 */
public final class SecAggDevice {
  /** What the server asked would break the protocol; the device does not answer it. */
  public static final class RefusedException extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    RefusedException(String message) {
      super(message);
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
  private final SecureRandom random;
  private Map<String, Advertisement> neighbours = new TreeMap<>();
  private int threshold;
  private final Map<String, Held> held = new TreeMap<>();
  private Set<String> answeredDropped;
  private Set<String> answeredSurvivors;

  /** Fresh keys and seed. */
  public SecAggDevice(String deviceId, byte[] context, SecureRandom random) throws GeneralSecurityException {
    this(deviceId, context, SecAggCrypto.generatePrivate(random), SecAggCrypto.generatePrivate(random),
        seed(random), random);
  }

  /** Given keys and seed (the cross-language tests). */
  public SecAggDevice(String deviceId, byte[] context, byte[] channelKey, byte[] maskKey, byte[] seed,
      SecureRandom random) {
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

  /** Shares of the self-mask seed and the mask key, one per neighbour, each sealed for it. */
  public Map<String, byte[]> shareKeys(Map<String, Advertisement> neighbourKeys, int threshold)
      throws GeneralSecurityException {
    if (neighbourKeys.containsKey(deviceId)) {
      throw new RefusedException("the server listed this device as its own neighbour");
    }
    if (threshold < 1 || neighbourKeys.size() < threshold) {
      throw new RefusedException(neighbourKeys.size() + " neighbours cannot hold shares " + threshold + " of n");
    }
    Advertisement own = advertise();
    Set<String> seen = new HashSet<>();
    List<byte[]> keys = new ArrayList<>();
    for (Advertisement a : neighbourKeys.values()) {
      keys.add(a.channel);
      keys.add(a.mask);
    }
    keys.add(own.channel);
    keys.add(own.mask);
    for (byte[] k : keys) {
      if (!seen.add(Arrays.toString(k))) {
        throw new RefusedException("two devices advertised the same public key");
      }
    }
    this.neighbours = new TreeMap<>(neighbourKeys);
    this.threshold = threshold;
    List<String> order = new ArrayList<>(this.neighbours.keySet());
    List<Shamir.Share> seedShares = Shamir.split(seed, threshold, order.size(), random);
    List<Shamir.Share> keyShares = Shamir.split(maskKey, threshold, order.size(), random);
    Map<String, byte[]> out = new LinkedHashMap<>();
    for (int i = 0; i < order.size(); i++) {
      String name = order.get(i);
      byte[] key = SecAggCrypto.agree(channelKey, this.neighbours.get(name).channel, SecAggCrypto.CHANNEL, context);
      byte[] message = pack(deviceId, name, seedShares.get(i), keyShares.get(i));
      out.put(name, SecAggCrypto.encrypt(key, message, associated(deviceId, name), random));
    }
    return out;
  }

  /** Keeps the shares the neighbours sent (those who did not send are out of the round). */
  public void receiveShares(Map<String, byte[]> ciphertexts) throws GeneralSecurityException {
    for (Map.Entry<String, byte[]> e : ciphertexts.entrySet()) {
      String sender = e.getKey();
      Advertisement a = neighbours.get(sender);
      if (a == null) {
        throw new RefusedException("shares from '" + sender + "', who is not a neighbour");
      }
      byte[] key = SecAggCrypto.agree(channelKey, a.channel, SecAggCrypto.CHANNEL, context);
      byte[] plain = SecAggCrypto.decrypt(key, e.getValue(), associated(sender, deviceId));
      held.put(sender, unpack(plain, sender));
    }
    if (held.size() < threshold) {
      throw new RefusedException(held.size() + " neighbours sent shares; the round needs " + threshold);
    }
  }

  /** The words plus the self mask and the pairwise masks with the neighbours who sent shares. */
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
    byte[] ids = ("|" + sender + "|" + receiver).getBytes(StandardCharsets.UTF_8);
    byte[] out = Arrays.copyOf(context, context.length + ids.length);
    System.arraycopy(ids, 0, out, context.length, ids.length);
    return out;
  }

  static byte[] pack(String sender, String receiver, Shamir.Share seedShare, Shamir.Share keyShare) {
    byte[] ids = (sender + "\n" + receiver + "\n").getBytes(StandardCharsets.UTF_8);
    byte[] out = new byte[2 + ids.length + 2 * Shamir.SHARE_BYTES];
    out[0] = (byte) (ids.length >>> 8);
    out[1] = (byte) ids.length;
    System.arraycopy(ids, 0, out, 2, ids.length);
    System.arraycopy(seedShare.toBytes(), 0, out, 2 + ids.length, Shamir.SHARE_BYTES);
    System.arraycopy(keyShare.toBytes(), 0, out, 2 + ids.length + Shamir.SHARE_BYTES, Shamir.SHARE_BYTES);
    return out;
  }

  private Held unpack(byte[] data, String sender) {
    int size = ((data[0] & 0xFF) << 8) | (data[1] & 0xFF);
    if (data.length != 2 + size + 2 * Shamir.SHARE_BYTES) {
      throw new RefusedException("a share message is malformed");
    }
    String[] ids = new String(data, 2, size, StandardCharsets.UTF_8).split("\n", -1);
    if (ids.length != 3 || !ids[0].equals(sender) || !ids[1].equals(deviceId)) {
      throw new RefusedException("a share message from '" + sender + "' names other devices");
    }
    int at = 2 + size;
    return new Held(
        Shamir.Share.fromBytes(Arrays.copyOfRange(data, at, at + Shamir.SHARE_BYTES)),
        Shamir.Share.fromBytes(Arrays.copyOfRange(data, at + Shamir.SHARE_BYTES, data.length)));
  }
}
