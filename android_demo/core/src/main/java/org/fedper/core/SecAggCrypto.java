package org.fedper.core;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.InvalidKeyException;
import java.security.KeyFactory;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.SecureRandom;
import java.security.spec.NamedParameterSpec;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Arrays;
import javax.crypto.Cipher;
import javax.crypto.KeyAgreement;
import javax.crypto.Mac;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.IvParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * Secure aggregation's cryptography from the platform's JCA, as fedper/common/secagg/keys.py and
 * prg.py (docs/SECAGG.md): X25519 ("XDH", Java 11 and Android API level 33 onwards; raw 32-byte
 * keys travel, and are wrapped in their fixed X.509 and PKCS#8 encodings for the JCA), HKDF-SHA256
 * (RFC 5869, written on HmacSHA256: the JCA has no HKDF), AES-256-GCM, and the mask generator,
 * AES-256-CTR from a zero counter block. Public keys are checked as revision 1.7 defines a valid
 * one ("To the byte", "Keys"), since the JCA accepts encodings the protocol refuses.
 */
public final class SecAggCrypto {
  public static final int KEY_BYTES = 32;
  public static final int NONCE_BYTES = 12;
  public static final int TAG_BYTES = 16;
  public static final String CHANNEL = "channel";
  public static final String MASK = "mask";
  // RFC 8410: SubjectPublicKeyInfo and PrivateKeyInfo of an X25519 key, before its 32 raw bytes.
  private static final byte[] X509_PREFIX = hex("302a300506032b656e032100");
  private static final byte[] PKCS8_PREFIX = hex("302e020100300506032b656e04220420");
  /** X25519's prime, 2^255 - 19: a canonical public key, read little-endian, is below it. */
  static final BigInteger FIELD = BigInteger.ONE.shiftLeft(255).subtract(BigInteger.valueOf(19));
  // Any private key does: X25519 clamps it to a multiple of 8, which takes every low-order point to
  // zero (Python's keys.py probes with the same one).
  private static final byte[] PROBE = probe();

  private SecAggCrypto() {}

  /** Whether this platform has X25519 (Android: API level 33 and later). */
  public static boolean supported() {
    try {
      KeyAgreement.getInstance("XDH");
      KeyFactory.getInstance("XDH");
      return true;
    } catch (GeneralSecurityException e) {
      return false;
    }
  }

  /** A fresh private key's 32 raw bytes. */
  public static byte[] generatePrivate(SecureRandom random) throws GeneralSecurityException {
    KeyPairGenerator generator = KeyPairGenerator.getInstance("XDH");
    generator.initialize(NamedParameterSpec.X25519, random);
    KeyPair pair = generator.generateKeyPair();
    byte[] encoded = pair.getPrivate().getEncoded();
    if (encoded.length != PKCS8_PREFIX.length + KEY_BYTES
        || !Arrays.equals(Arrays.copyOf(encoded, PKCS8_PREFIX.length), PKCS8_PREFIX)) {
      throw new GeneralSecurityException("the platform's X25519 private key has an unexpected encoding");
    }
    return Arrays.copyOfRange(encoded, PKCS8_PREFIX.length, encoded.length);
  }

  public static byte[] publicFromPrivate(byte[] privateRaw) throws GeneralSecurityException {
    // X25519(k, 9): agreeing with the base point gives the public key.
    byte[] basePoint = new byte[KEY_BYTES];
    basePoint[0] = 9;
    return exchange(privateRaw, basePoint);
  }

  /**
   * A public key the protocol accepts, or InvalidKeyException: 32 bytes, canonical (read as a
   * little-endian integer, below 2^255 - 19, so bit 255 is clear) and not of low order (X25519 of it
   * with any private key would be all zeros). The JCA would take a non-canonical key as the point
   * it reduces to, so two encodings of one key would pass the check for repeated keys, and a
   * low-order key gives every device the same agreement.
   */
  public static void checkPublic(byte[] key) throws InvalidKeyException {
    if (key.length != KEY_BYTES) {
      throw new InvalidKeyException("an X25519 public key is " + KEY_BYTES + " bytes, got " + key.length);
    }
    byte[] bigEndian = new byte[KEY_BYTES];
    for (int i = 0; i < KEY_BYTES; i++) {
      bigEndian[i] = key[KEY_BYTES - 1 - i];
    }
    if (new BigInteger(1, bigEndian).compareTo(FIELD) >= 0) {
      throw new InvalidKeyException("the public key is not in canonical form (u >= 2^255 - 19)");
    }
    try {
      exchange(PROBE, key);
    } catch (GeneralSecurityException e) { // a zero agreement, refused here or by the JCA
      throw new InvalidKeyException("the public key is a point of low order", e);
    }
  }

  /** The 32-byte key two devices share for purpose in context (the round); theirPublic is checked. */
  public static byte[] agree(byte[] ownPrivate, byte[] theirPublic, String purpose, byte[] context)
      throws GeneralSecurityException {
    checkPublic(theirPublic);
    byte[] secret = exchange(ownPrivate, theirPublic);
    return hkdf(secret, info(purpose, context));
  }

  /** HKDF's info: "fedper secagg " || purpose || " " || context, ASCII. */
  static byte[] info(String purpose, byte[] context) {
    byte[] prefix = ("fedper secagg " + purpose + " ").getBytes(StandardCharsets.US_ASCII);
    return concat(prefix, context);
  }

  /** X25519(ownPrivate, theirPublic), raw; a zero result (a low-order key) is refused. */
  static byte[] exchange(byte[] ownPrivate, byte[] theirPublic) throws GeneralSecurityException {
    if (ownPrivate.length != KEY_BYTES || theirPublic.length != KEY_BYTES) {
      throw new GeneralSecurityException("X25519 keys are " + KEY_BYTES + " bytes");
    }
    KeyFactory factory = KeyFactory.getInstance("XDH");
    PrivateKey own = factory.generatePrivate(new PKCS8EncodedKeySpec(concat(PKCS8_PREFIX, ownPrivate)));
    PublicKey theirs = factory.generatePublic(new X509EncodedKeySpec(concat(X509_PREFIX, theirPublic)));
    KeyAgreement agreement = KeyAgreement.getInstance("XDH");
    agreement.init(own);
    agreement.doPhase(theirs, true);
    byte[] secret = agreement.generateSecret();
    boolean zero = true;
    for (byte b : secret) {
      zero &= b == 0;
    }
    if (zero) { // a low-order point: refused, as Python's cryptography refuses it
      throw new GeneralSecurityException("public key refused: the shared secret is zero");
    }
    return secret;
  }

  /** HKDF-SHA256 with no salt (a zero key, RFC 5869 section 2.2) and one output block. */
  static byte[] hkdf(byte[] secret, byte[] info) throws GeneralSecurityException {
    Mac mac = Mac.getInstance("HmacSHA256");
    mac.init(new SecretKeySpec(new byte[32], "HmacSHA256"));
    byte[] prk = mac.doFinal(secret);
    mac.init(new SecretKeySpec(prk, "HmacSHA256"));
    mac.update(info);
    mac.update((byte) 1);
    return mac.doFinal();
  }

  /**
   * AES-256-GCM: nonce || ciphertext || tag; associated is bound, not sent. The nonce must be
   * fresh for the key (SecAggRandom draws it), which is why it is the caller's to give.
   */
  public static byte[] encrypt(byte[] key, byte[] nonce, byte[] plaintext, byte[] associated)
      throws GeneralSecurityException {
    if (nonce.length != NONCE_BYTES) {
      throw new GeneralSecurityException("a nonce is " + NONCE_BYTES + " bytes, got " + nonce.length);
    }
    Cipher cipher = Cipher.getInstance("AES/GCM/NoPadding");
    cipher.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(8 * TAG_BYTES, nonce));
    cipher.updateAAD(associated);
    return concat(nonce, cipher.doFinal(plaintext));
  }

  public static byte[] decrypt(byte[] key, byte[] ciphertext, byte[] associated) throws GeneralSecurityException {
    if (ciphertext.length < NONCE_BYTES + TAG_BYTES) {
      throw new GeneralSecurityException("a ciphertext is at least " + (NONCE_BYTES + TAG_BYTES) + " bytes");
    }
    Cipher cipher = Cipher.getInstance("AES/GCM/NoPadding");
    GCMParameterSpec spec = new GCMParameterSpec(8 * TAG_BYTES, ciphertext, 0, NONCE_BYTES);
    cipher.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "AES"), spec);
    cipher.updateAAD(associated);
    return cipher.doFinal(ciphertext, NONCE_BYTES, ciphertext.length - NONCE_BYTES);
  }

  /** words pseudo-random uint32 (as int bits): the AES-256-CTR keystream's little-endian words. */
  public static int[] expand(byte[] seed, int words) throws GeneralSecurityException {
    if (seed.length != KEY_BYTES) {
      throw new GeneralSecurityException("a mask seed is " + KEY_BYTES + " bytes, got " + seed.length);
    }
    Cipher cipher = Cipher.getInstance("AES/CTR/NoPadding");
    cipher.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(seed, "AES"), new IvParameterSpec(new byte[16]));
    byte[] stream = cipher.doFinal(new byte[4 * words]);
    int[] out = new int[words];
    ByteBuffer.wrap(stream).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().get(out);
    return out;
  }

  private static byte[] probe() {
    byte[] k = new byte[KEY_BYTES];
    k[0] = 8;
    k[KEY_BYTES - 1] = 64;
    return k;
  }

  static byte[] concat(byte[] a, byte[] b) {
    byte[] out = Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }

  static byte[] hex(String s) {
    byte[] out = new byte[s.length() / 2];
    for (int i = 0; i < out.length; i++) {
      out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
    }
    return out;
  }
}
