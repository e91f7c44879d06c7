package org.fedper.core;

import java.math.BigInteger;
import java.security.SecureRandom;

/**
 * What a device draws at random in a secure round besides its keys and seed (docs/SECAGG.md,
 * "To the byte"): the Shamir coefficients (the seed's t-1, then the mask key's t-1) and one
 * AES-GCM nonce per sealed message (receivers in id order). On a phone a SecureRandom draws them;
 * the known-answer test injects the values docs/secagg_vectors.json lists, in that order, so the
 * Java device's sealed bytes can be compared with the vectors' byte for byte.
 */
public interface SecAggRandom {
  /** A coefficient uniform in [0, Shamir.PRIME). */
  BigInteger coefficient();

  /** A fresh 12-byte nonce (SecAggCrypto.NONCE_BYTES). */
  byte[] nonce();

  /** The platform's randomness: what every real round uses. */
  static SecAggRandom secure(SecureRandom random) {
    return new SecAggRandom() {
      @Override
      public BigInteger coefficient() {
        BigInteger c;
        do { // rejection sampling: uniform over the field, not biased toward small values
          c = new BigInteger(Shamir.PRIME.bitLength(), random);
        } while (c.compareTo(Shamir.PRIME) >= 0);
        return c;
      }

      @Override
      public byte[] nonce() {
        byte[] nonce = new byte[SecAggCrypto.NONCE_BYTES];
        random.nextBytes(nonce);
        return nonce;
      }
    };
  }
}
