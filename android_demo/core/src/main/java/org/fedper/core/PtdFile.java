package org.fedper.core;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * ExecuTorch ".ptd" weight files (FlatTensor: a flatbuffer index plus aligned data segments).
 * A phone gets the program's weight file once with the export; every round it writes the current
 * base and head into a copy of it, in place (same names, shapes and offsets, so the program loads
 * it exactly as it loaded the original), and loads the program with that copy. Only reading the
 * index is needed, never building one.
 */
public final class PtdFile {
  private static final int FLOAT = 6; // executorch_flatbuffer.ScalarType.FLOAT

  private final byte[] bytes;
  private final ByteBuffer buf;
  private final Map<String, long[]> shapes = new LinkedHashMap<>();
  private final Map<String, Integer> positions = new LinkedHashMap<>();

  public PtdFile(byte[] ptd) {
    this.bytes = ptd.clone();
    this.buf = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    if (bytes.length < 48 || !"FT01".equals(ascii(4, 4)) || !"FH01".equals(ascii(8, 4))) {
      throw new IllegalArgumentException("not an ExecuTorch .ptd file (FlatTensor FT01 with header FH01)");
    }
    long segmentBase = buf.getLong(8 + 24);
    int root = u32(0);
    int segments = field(root, 1);
    int named = field(root, 2);
    if (segments < 0 || named < 0) {
      throw new IllegalArgumentException(".ptd index has no segments or named data");
    }
    int nSegments = u32(segments);
    int nNamed = u32(named);
    for (int k = 0; k < nNamed; k++) {
      int entry = indirect(named + 4 + 4 * k);
      String key = string(field(entry, 0));
      int segmentIndex = scalarField(entry, 1);
      int layout = field(entry, 2);
      if (layout < 0 || segmentIndex >= nSegments) {
        continue; // not a tensor (opaque named data)
      }
      int scalarType = byteField(layout, 0);
      int sizes = field(layout, 1);
      int rank = sizes < 0 ? 0 : u32(sizes);
      long[] shape = new long[rank];
      for (int d = 0; d < rank; d++) {
        shape[d] = buf.getInt(sizes + 4 + 4 * d);
      }
      int segment = indirect(segments + 4 + 4 * segmentIndex);
      long offset = longField(segment, 0);
      long size = longField(segment, 1);
      long start = segmentBase + offset;
      if (scalarType != FLOAT || size != 4 * Tensor.numel(shape) || start + size > bytes.length) {
        throw new IllegalArgumentException(".ptd tensor " + key + ": not float32 of its shape within the file");
      }
      shapes.put(key, shape);
      positions.put(key, (int) start);
    }
  }

  public Map<String, long[]> shapes() {
    return shapes;
  }

  public Tensor get(String name) {
    Integer pos = positions.get(name);
    if (pos == null) {
      throw new IllegalArgumentException(".ptd has no tensor " + name);
    }
    long[] shape = shapes.get(name);
    float[] values = new float[(int) Tensor.numel(shape)];
    for (int k = 0; k < values.length; k++) {
      values[k] = buf.getFloat(pos + 4 * k);
    }
    return new Tensor(shape, values);
  }

  /** Overwrites named tensors; each must exist in the file with the same shape. */
  public void set(Map<String, Tensor> tensors) {
    for (Map.Entry<String, Tensor> e : tensors.entrySet()) {
      Integer pos = positions.get(e.getKey());
      if (pos == null) {
        throw new IllegalArgumentException(".ptd has no tensor " + e.getKey());
      }
      if (!java.util.Arrays.equals(shapes.get(e.getKey()), e.getValue().shape())) {
        throw new IllegalArgumentException("tensor " + e.getKey() + " has shape "
            + java.util.Arrays.toString(e.getValue().shape()) + ", the .ptd holds "
            + java.util.Arrays.toString(shapes.get(e.getKey())));
      }
      float[] values = e.getValue().data();
      for (int k = 0; k < values.length; k++) {
        buf.putFloat(pos + 4 * k, values[k]);
      }
    }
  }

  public byte[] toBytes() {
    return bytes.clone();
  }

  // --- flatbuffer reading: tables with vtables, offsets relative to where they are stored ---

  private int u32(int pos) {
    return buf.getInt(pos);
  }

  private int indirect(int pos) {
    return pos + buf.getInt(pos);
  }

  /** Position of field i's value in table t, or -1 when absent. */
  private int slot(int table, int i) {
    int vtable = table - buf.getInt(table);
    int vtableSize = buf.getShort(vtable) & 0xffff;
    int at = 4 + 2 * i;
    if (at >= vtableSize) {
      return -1;
    }
    int off = buf.getShort(vtable + at) & 0xffff;
    return off == 0 ? -1 : table + off;
  }

  private int field(int table, int i) {
    int p = slot(table, i);
    return p < 0 ? -1 : indirect(p);
  }

  private int scalarField(int table, int i) {
    int p = slot(table, i);
    return p < 0 ? 0 : buf.getInt(p);
  }

  private int byteField(int table, int i) {
    int p = slot(table, i);
    return p < 0 ? 0 : buf.get(p);
  }

  private long longField(int table, int i) {
    int p = slot(table, i);
    return p < 0 ? 0 : buf.getLong(p);
  }

  private String string(int pos) {
    return pos < 0 ? "" : new String(bytes, pos + 4, u32(pos), StandardCharsets.UTF_8);
  }

  private String ascii(int pos, int n) {
    return new String(bytes, pos, n, StandardCharsets.US_ASCII);
  }
}
