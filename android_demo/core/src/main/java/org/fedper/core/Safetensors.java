package org.fedper.core;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length, a JSON header, then the raw little-endian tensor bytes. Reads F32 and F16 (as float);
 * writes F32, which is what the server serves and accepts. Bounds are checked the way the
 * server's upload validation checks them, so a bad file is an error, never a crash or a guess.
 */
public final class Safetensors {
  private static final long MAX_HEADER = 100L * 1024 * 1024;

  private Safetensors() {}

  /** Named tensors (in file order of their offsets) and the header's __metadata__. */
  public static final class File {
    public final Map<String, Tensor> tensors;
    public final Map<String, String> metadata;

    File(Map<String, Tensor> tensors, Map<String, String> metadata) {
      this.tensors = Collections.unmodifiableMap(tensors);
      this.metadata = Collections.unmodifiableMap(metadata);
    }
  }

  public static File read(byte[] bytes) {
    if (bytes.length < 8) {
      throw new IllegalArgumentException("not a safetensors file: shorter than its 8-byte header length");
    }
    ByteBuffer buf = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    long headerLength = buf.getLong(0);
    if (headerLength < 2 || headerLength > MAX_HEADER || 8 + headerLength > bytes.length) {
      throw new IllegalArgumentException("safetensors header length " + headerLength + " does not fit the file");
    }
    String headerText = new String(bytes, 8, (int) headerLength, StandardCharsets.UTF_8);
    JsonFields header = JsonFields.parse(headerText, "safetensors header");
    int dataStart = 8 + (int) headerLength;
    long dataLength = bytes.length - dataStart;
    Map<String, String> metadata = new LinkedHashMap<>();
    List<long[]> spans = new ArrayList<>();
    Map<String, Tensor> tensors = new LinkedHashMap<>();
    for (String name : header.json().keySet()) {
      if (name.equals("__metadata__")) {
        metadata.putAll(header.stringMap(name));
        continue;
      }
      JsonFields info = header.object(name);
      String dtype = info.string("dtype");
      long[] shape = info.longs("shape");
      long[] offsets = info.longs("data_offsets");
      int itemSize = dtype.equals("F32") ? 4 : dtype.equals("F16") ? 2 : -1;
      if (itemSize < 0) {
        throw new IllegalArgumentException("tensor " + name + ": dtype " + dtype + ", expected F32 or F16");
      }
      for (long d : shape) {
        if (d < 0) {
          throw new IllegalArgumentException("tensor " + name + ": negative dimension in shape");
        }
      }
      long n = Tensor.numel(shape);
      if (offsets.length != 2 || offsets[0] < 0 || offsets[1] > dataLength || offsets[0] > offsets[1]) {
        throw new IllegalArgumentException("tensor " + name + ": offsets outside the data");
      }
      if (offsets[1] - offsets[0] != n * itemSize) {
        throw new IllegalArgumentException("tensor " + name + ": offsets do not match shape x dtype");
      }
      spans.add(offsets);
      float[] values = new float[(int) n];
      int base = dataStart + (int) offsets[0];
      for (int k = 0; k < n; k++) {
        values[k] =
            itemSize == 4 ? buf.getFloat(base + 4 * k) : halfToFloat(buf.getShort(base + 2 * k));
      }
      tensors.put(name, new Tensor(shape, values));
    }
    spans.sort((a, b) -> Long.compare(a[0], b[0]));
    long end = 0;
    for (long[] span : spans) {
      if (span[0] != end) {
        throw new IllegalArgumentException("safetensors data has gaps or overlapping tensors");
      }
      end = span[1];
    }
    if (end != dataLength) {
      throw new IllegalArgumentException("safetensors data has trailing bytes");
    }
    return new File(tensors, metadata);
  }

  /**
   * F32 safetensors bytes with tensors in the given order and optional metadata. The header is
   * org.json's compact form, keys in insertion order (org.json writes '/' as the escape \/,
   * which every JSON reader, the server's included, reads as '/').
   */
  public static byte[] write(Map<String, Tensor> tensors, Map<String, String> metadata) {
    JSONObject header = new JSONObject();
    long offset = 0;
    try {
      if (metadata != null && !metadata.isEmpty()) {
        JSONObject meta = new JSONObject();
        for (Map.Entry<String, String> e : metadata.entrySet()) {
          meta.put(e.getKey(), e.getValue());
        }
        header.put("__metadata__", meta);
      }
      for (Map.Entry<String, Tensor> e : tensors.entrySet()) {
        long size = 4L * e.getValue().size();
        JSONArray shape = new JSONArray();
        for (long d : e.getValue().shape()) {
          shape.put(d);
        }
        JSONObject info = new JSONObject();
        info.put("dtype", "F32");
        info.put("shape", shape);
        info.put("data_offsets", new JSONArray().put(offset).put(offset + size));
        header.put(e.getKey(), info);
        offset += size;
      }
    } catch (JSONException ex) {
      throw new IllegalArgumentException("cannot write a safetensors header: " + ex.getMessage(), ex);
    }
    byte[] json = header.toString().getBytes(StandardCharsets.UTF_8);
    int padded = (json.length + 7) / 8 * 8; // the format pads the header with spaces to 8 bytes
    ByteBuffer out = ByteBuffer.allocate(8 + padded + (int) offset).order(ByteOrder.LITTLE_ENDIAN);
    out.putLong(padded);
    out.put(json);
    for (int k = json.length; k < padded; k++) {
      out.put((byte) ' ');
    }
    for (Tensor t : tensors.values()) {
      for (float v : t.data()) {
        out.putFloat(v);
      }
    }
    return out.array();
  }

  static float halfToFloat(short h) {
    int bits = h & 0xffff;
    int sign = (bits & 0x8000) << 16;
    int exp = (bits >>> 10) & 0x1f;
    int mant = bits & 0x3ff;
    if (exp == 0) {
      float v = mant * (1f / (1 << 24));
      return sign != 0 ? -v : v;
    }
    if (exp == 31) {
      return Float.intBitsToFloat(sign | 0x7f800000 | (mant << 13));
    }
    return Float.intBitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  }
}
