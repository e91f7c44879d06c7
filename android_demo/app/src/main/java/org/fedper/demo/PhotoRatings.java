package org.fedper.demo;

import android.content.Context;
import android.graphics.Bitmap;
import android.graphics.BitmapFactory;
import android.net.Uri;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fedper.core.AtomicFiles;
import org.fedper.core.Json;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;

/**
 * The photos this user rated 1-5, in app-private storage: each as the model's input pixels
 * (center square, resized, normalized as the manifest says) plus its rating. Photos never leave
 * the phone; one in five (by a stable hash) is kept for the local test split.
 */
final class PhotoRatings implements LocalData {
  private final List<float[]> train = new ArrayList<>();
  private final List<Long> trainLabels = new ArrayList<>();
  private final List<float[]> test = new ArrayList<>();
  private final List<Long> testLabels = new ArrayList<>();

  static Path root(Context context) {
    return context.getFilesDir().toPath().resolve("ratings");
  }

  /** Stores one rated photo (as pixels the model reads) and its rating. */
  static void add(Context context, Uri photo, int rating, int size, float[] mean, float[] std) throws IOException {
    float[] pixels = pixels(context, photo, size, mean, std);
    String id = Integer.toHexString(photo.toString().hashCode()) + "-" + size;
    ByteBuffer buf = ByteBuffer.allocate(4 * pixels.length).order(ByteOrder.LITTLE_ENDIAN);
    for (float v : pixels) {
      buf.putFloat(v);
    }
    AtomicFiles.write(root(context).resolve(id + ".f32"), buf.array());
    Map<String, Object> index = index(context);
    index.put(id, (long) rating);
    AtomicFiles.write(root(context).resolve("index.json"), Json.write(index).getBytes(StandardCharsets.UTF_8));
  }

  static Map<String, Object> index(Context context) throws IOException {
    Path p = root(context).resolve("index.json");
    return Files.exists(p)
        ? Json.parseObject(new String(Files.readAllBytes(p), StandardCharsets.UTF_8))
        : new LinkedHashMap<>();
  }

  static PhotoRatings load(Context context, Manifest manifest) throws IOException {
    PhotoRatings r = new PhotoRatings();
    for (Map.Entry<String, Object> e : index(context).entrySet()) {
      if (!e.getKey().endsWith("-" + manifest.inputSize)) {
        continue; // rated for a model with another input size
      }
      byte[] raw = Files.readAllBytes(root(context).resolve(e.getKey() + ".f32"));
      float[] pixels = new float[raw.length / 4];
      ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(pixels);
      long label = ((Number) e.getValue()).longValue() - 1; // ratings 1..5 are classes 0..4
      boolean isTest = Math.floorMod(e.getKey().hashCode(), 5) == 0;
      (isTest ? r.test : r.train).add(pixels);
      (isTest ? r.testLabels : r.trainLabels).add(label);
    }
    return r;
  }

  static float[] pixels(Context context, Uri photo, int size, float[] mean, float[] std) throws IOException {
    Bitmap full;
    try (InputStream in = context.getContentResolver().openInputStream(photo)) {
      full = BitmapFactory.decodeStream(in);
    }
    if (full == null) {
      throw new IOException("cannot decode " + photo);
    }
    int side = Math.min(full.getWidth(), full.getHeight());
    Bitmap square = Bitmap.createBitmap(full, (full.getWidth() - side) / 2, (full.getHeight() - side) / 2, side, side);
    Bitmap small = Bitmap.createScaledBitmap(square, size, size, true);
    float[] out = new float[3 * size * size];
    for (int y = 0; y < size; y++) {
      for (int x = 0; x < size; x++) {
        int c = small.getPixel(x, y);
        int[] rgb = {(c >> 16) & 0xff, (c >> 8) & 0xff, c & 0xff};
        for (int ch = 0; ch < 3; ch++) {
          out[ch * size * size + y * size + x] = (rgb[ch] / 255f - mean[ch]) / std[ch];
        }
      }
    }
    return out;
  }

  @Override public int trainSize() {
    return train.size();
  }

  @Override public Batch trainBatch(int[] indices) {
    return batch(train, trainLabels, indices);
  }

  @Override public Batch testSet() {
    int[] all = new int[test.size()];
    for (int k = 0; k < all.length; k++) {
      all[k] = k;
    }
    return batch(test, testLabels, all);
  }

  private static Batch batch(List<float[]> images, List<Long> labels, int[] indices) {
    int per = images.isEmpty() ? 0 : images.get(0).length;
    float[] pixels = new float[indices.length * per];
    long[] y = new long[indices.length];
    for (int k = 0; k < indices.length; k++) {
      System.arraycopy(images.get(indices[k]), 0, pixels, k * per, per);
      y[k] = labels.get(indices[k]);
    }
    return new Batch(pixels, y);
  }

  static float[][] normalization(Manifest manifest) {
    Map<?, ?> norm = (Map<?, ?>) ((Map<?, ?>) manifest.raw.get("input")).get("normalization");
    float[][] out = new float[2][3];
    for (int k = 0; k < 3; k++) {
      out[0][k] = ((Number) ((List<?>) norm.get("mean")).get(k)).floatValue();
      out[1][k] = ((Number) ((List<?>) norm.get("std")).get(k)).floatValue();
    }
    return out;
  }
}
