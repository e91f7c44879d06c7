package org.fedper.core;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Supplier;

/**
 * Shamir's t-of-n sharing of a 32-byte secret over the field of the prime 2^521 - 1, as
 * fedper/common/secagg/shamir.py (docs/SECAGG.md): share i is the random degree t-1 polynomial
 * with the secret as constant term, evaluated at i; a share travels as 2 bytes of index and 66 of
 * value, big-endian. The coefficients come from the caller (SecAggRandom: the platform's
 * randomness, or the known-answer vectors' values), so a split can be reproduced byte for byte.
 */
public final class Shamir {
  public static final BigInteger PRIME = BigInteger.ONE.shiftLeft(521).subtract(BigInteger.ONE);
  public static final int SECRET_BYTES = 32;
  public static final int VALUE_BYTES = 66;
  public static final int SHARE_BYTES = 2 + VALUE_BYTES;

  private Shamir() {}

  /** The polynomial's value at index (1-based). */
  public static final class Share {
    public final int index;
    public final BigInteger value;

    public Share(int index, BigInteger value) {
      if (index < 1 || index > 0xFFFF || value.signum() < 0 || value.compareTo(PRIME) >= 0) {
        throw new IllegalArgumentException("share index " + index + " or value is out of the field");
      }
      this.index = index;
      this.value = value;
    }

    public byte[] toBytes() {
      byte[] out = new byte[SHARE_BYTES];
      out[0] = (byte) (index >>> 8);
      out[1] = (byte) index;
      byte[] v = value.toByteArray(); // big-endian, maybe with a leading zero byte
      int copy = Math.min(v.length, VALUE_BYTES);
      System.arraycopy(v, v.length - copy, out, SHARE_BYTES - copy, copy);
      return out;
    }

    public static Share fromBytes(byte[] data) {
      if (data.length != SHARE_BYTES) {
        throw new IllegalArgumentException("a share is " + SHARE_BYTES + " bytes, got " + data.length);
      }
      int index = ((data[0] & 0xFF) << 8) | (data[1] & 0xFF);
      byte[] v = new byte[VALUE_BYTES];
      System.arraycopy(data, 2, v, 0, VALUE_BYTES);
      return new Share(index, new BigInteger(1, v));
    }
  }

  /**
   * holders shares of secret, any threshold of which give it back; coefficients supplies a_1 to
   * a_(t-1), in that order, each in [0, PRIME).
   */
  public static List<Share> split(byte[] secret, int threshold, int holders, Supplier<BigInteger> coefficients) {
    if (secret.length != SECRET_BYTES) {
      throw new IllegalArgumentException("a secret is " + SECRET_BYTES + " bytes, got " + secret.length);
    }
    if (threshold < 1 || threshold > holders || holders >= 0x10000) {
      throw new IllegalArgumentException(
          "need 1 <= threshold (" + threshold + ") <= holders (" + holders + ") < 65536");
    }
    BigInteger[] polynomial = new BigInteger[threshold];
    polynomial[0] = new BigInteger(1, secret);
    for (int i = 1; i < threshold; i++) {
      BigInteger c = coefficients.get();
      if (c.signum() < 0 || c.compareTo(PRIME) >= 0) {
        throw new IllegalArgumentException("a coefficient is outside the field");
      }
      polynomial[i] = c;
    }
    List<Share> shares = new ArrayList<>();
    for (int x = 1; x <= holders; x++) {
      BigInteger value = BigInteger.ZERO;
      BigInteger bx = BigInteger.valueOf(x);
      for (int i = threshold - 1; i >= 0; i--) { // Horner
        value = value.multiply(bx).add(polynomial[i]).mod(PRIME);
      }
      shares.add(new Share(x, value));
    }
    return shares;
  }

  /** The secret from at least threshold shares of distinct holders (the first threshold used). */
  public static byte[] combine(List<Share> shares, int threshold) {
    Set<Integer> indices = new HashSet<>();
    for (Share s : shares) {
      if (!indices.add(s.index)) {
        throw new IllegalArgumentException("two shares have the same index");
      }
    }
    if (shares.size() < threshold) {
      throw new IllegalArgumentException(
          shares.size() + " shares cannot give back a secret shared " + threshold + " of n");
    }
    List<Share> used = shares.subList(0, threshold);
    BigInteger secret = BigInteger.ZERO;
    for (Share s : used) {
      BigInteger numerator = BigInteger.ONE;
      BigInteger denominator = BigInteger.ONE;
      for (Share other : used) {
        if (other.index != s.index) {
          numerator = numerator.multiply(BigInteger.valueOf(other.index)).mod(PRIME);
          denominator = denominator.multiply(BigInteger.valueOf(other.index - s.index)).mod(PRIME);
        }
      }
      secret = secret.add(s.value.multiply(numerator).multiply(denominator.modInverse(PRIME))).mod(PRIME);
    }
    if (secret.bitLength() > 8 * SECRET_BYTES) {
      throw new IllegalArgumentException("the shares are not of one 32-byte secret");
    }
    byte[] out = new byte[SECRET_BYTES];
    byte[] v = secret.toByteArray();
    int copy = Math.min(v.length, SECRET_BYTES);
    System.arraycopy(v, v.length - copy, out, SECRET_BYTES - copy, copy);
    return out;
  }
}
