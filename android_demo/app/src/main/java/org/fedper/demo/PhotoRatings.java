package org.fedper.demo;

import android.content.Context;
import android.graphics.Bitmap;
import android.graphics.BitmapFactory;
import android.graphics.Matrix;
import android.media.ExifInterface;
import android.net.Uri;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.fedper.core.AtomicFiles;
import org.fedper.core.LocalData;
import org.fedper.core.Manifest;

/**
 * The photos this user rated 1-5, in app-private storage. Each is kept as a small upright JPEG
 * (longest side {@link #KEPT_SIDE}, EXIF rotation applied) with its rating in the file name, and
 * turned into model input (center square, resized, normalized) only when a round or a score needs
 * it, from that export's manifest: a new export with another input size or normalization reuses
 * every photo. Photos never leave the phone; one in five (by a stable hash) is the local test split.
 */
final class PhotoRatings implements LocalData {
  /** Longest side of a kept photo: well above any exported input size, small on disk. */
  static final int KEPT_SIDE = 256;
  /**
   * The rating scale, 1..RATING_LEVELS stars, which are the model's classes 0..RATING_LEVELS-1:
   * the one place it is set, so the file names, the labels and the check of an export agree.
   */
  static final int RATING_LEVELS = 5;
  /** A kept photo's file name: a hash of its Uri and its rating. */
  private static final Pattern KEPT_NAME = Pattern.compile("[0-9a-f]+\\.r([1-9][0-9]?)\\.jpg");

  private final List<float[]> train = new ArrayList<>();
  private final List<Long> trainLabels = new ArrayList<>();
  private final List<float[]> test = new ArrayList<>();
  private final List<Long> testLabels = new ArrayList<>();

  static Path root(Context context) {
    return context.getFilesDir().toPath().resolve("ratings");
  }

  /**
   * Refuses an export whose classes are not the rating scale: training on it would feed labels the
   * model has no class for (or leave classes no photo can have), and its scores would not be ratings.
   */
  static void requireRatingScale(Manifest manifest) {
    if (manifest.numClasses != RATING_LEVELS) {
      throw new IllegalArgumentException(String.format(Locale.ROOT,
          "this model predicts %d classes; the app rates photos 1-%d (%d classes)",
          manifest.numClasses, RATING_LEVELS, RATING_LEVELS));
    }
  }

  /** Keeps one rated photo (downscaled, upright) under a name carrying its rating 1..RATING_LEVELS. */
  static void add(Context context, Uri photo, int rating) throws IOException {
    if (rating < 1 || rating > RATING_LEVELS) {
      throw new IllegalArgumentException("rating " + rating + " is not 1-" + RATING_LEVELS);
    }
    Bitmap upright = decodeUpright(context, photo, KEPT_SIDE);
    ByteArrayOutputStream jpeg = new ByteArrayOutputStream();
    if (!upright.compress(Bitmap.CompressFormat.JPEG, 90, jpeg)) {
      throw new IOException("cannot re-encode " + photo);
    }
    upright.recycle();
    String id = Integer.toHexString(photo.toString().hashCode());
    try (Stream<Path> old = Files.list(Files.createDirectories(root(context)))) {
      for (Path p : (Iterable<Path>) old::iterator) {
        if (p.getFileName().toString().startsWith(id + ".")) {
          Files.delete(p); // re-rated: the new rating replaces the old one
        }
      }
    }
    AtomicFiles.write(root(context).resolve(id + ".r" + rating + ".jpg"), jpeg.toByteArray());
  }

  /** Rated photos, as kept files. */
  static List<Path> kept(Context context) throws IOException {
    List<Path> out = new ArrayList<>();
    if (!Files.isDirectory(root(context))) {
      return out;
    }
    try (Stream<Path> files = Files.list(root(context))) {
      files.filter(p -> ratingOf(p.getFileName().toString()) > 0).sorted().forEach(out::add);
    }
    return out;
  }

  /** The rating in a kept photo's file name, or 0 if the name is not a kept photo's. */
  private static int ratingOf(String name) {
    Matcher m = KEPT_NAME.matcher(name);
    if (!m.matches()) {
      return 0;
    }
    int rating = Integer.parseInt(m.group(1));
    return rating <= RATING_LEVELS ? rating : 0;
  }

  /**
   * Photos rated by the first version of the app, kept only as pixels at a guessed size and
   * normalization: they cannot be turned back into photos, so the app counts them and asks the
   * user to rate them again instead of training on wrongly normalized pixels.
   */
  static int legacyCount(Context context) throws IOException {
    if (!Files.isDirectory(root(context))) {
      return 0;
    }
    try (Stream<Path> files = Files.list(root(context))) {
      return (int) files.filter(p -> p.getFileName().toString().endsWith(".f32")).count();
    }
  }

  /** The kept photos as this export's training and test data; refuses an export not made for ratings. */
  static PhotoRatings load(Context context, Manifest manifest) throws IOException {
    requireRatingScale(manifest);
    PhotoRatings r = new PhotoRatings();
    for (Path p : kept(context)) {
      String name = p.getFileName().toString();
      long label = ratingOf(name) - 1; // ratings 1..RATING_LEVELS are classes 0..RATING_LEVELS-1
      Bitmap photo = BitmapFactory.decodeFile(p.toString());
      if (photo == null) {
        throw new IOException("cannot decode the kept photo " + p);
      }
      float[] pixels = modelInput(photo, manifest);
      photo.recycle();
      boolean isTest = Math.floorMod(name.substring(0, name.indexOf('.')).hashCode(), 5) == 0;
      (isTest ? r.test : r.train).add(pixels);
      (isTest ? r.testLabels : r.trainLabels).add(label);
    }
    return r;
  }

  /** The model input for a photo picked from the gallery (for scoring). */
  static float[] pixels(Context context, Uri photo, Manifest manifest) throws IOException {
    Bitmap upright = decodeUpright(context, photo, KEPT_SIDE);
    float[] out = modelInput(upright, manifest);
    upright.recycle();
    return out;
  }

  /**
   * Decodes a photo at most maxSide on its longest side and rotates it upright. It never decodes
   * the full camera image (a 50 MP photo is 200 MB as a bitmap): the decoder subsamples by a power
   * of two first. Used for kept photos, model input and the on-screen preview alike.
   */
  static Bitmap decodeUpright(Context context, Uri photo, int maxSide) throws IOException {
    BitmapFactory.Options bounds = new BitmapFactory.Options();
    bounds.inJustDecodeBounds = true;
    try (InputStream in = context.getContentResolver().openInputStream(photo)) {
      BitmapFactory.decodeStream(in, null, bounds);
    }
    if (bounds.outWidth <= 0 || bounds.outHeight <= 0) {
      throw new IOException("cannot decode " + photo + " as an image");
    }
    BitmapFactory.Options opts = new BitmapFactory.Options();
    opts.inSampleSize = 1;
    while (Math.max(bounds.outWidth, bounds.outHeight) / (opts.inSampleSize * 2) >= maxSide) {
      opts.inSampleSize *= 2;
    }
    Bitmap decoded;
    try (InputStream in = context.getContentResolver().openInputStream(photo)) {
      decoded = BitmapFactory.decodeStream(in, null, opts);
    }
    if (decoded == null) {
      throw new IOException("cannot decode " + photo + " as an image");
    }
    int degrees;
    try (InputStream in = context.getContentResolver().openInputStream(photo)) {
      degrees = rotationDegrees(new ExifInterface(in).getAttributeInt(
          ExifInterface.TAG_ORIENTATION, ExifInterface.ORIENTATION_NORMAL));
    }
    float scale = Math.min(1f, (float) maxSide / Math.max(decoded.getWidth(), decoded.getHeight()));
    Matrix m = new Matrix();
    m.postScale(scale, scale);
    m.postRotate(degrees);
    Bitmap upright = Bitmap.createBitmap(decoded, 0, 0, decoded.getWidth(), decoded.getHeight(), m, true);
    if (upright != decoded) {
      decoded.recycle();
    }
    return upright;
  }

  /** EXIF orientation to a clockwise rotation (mirrored orientations are rare on phones: kept unmirrored). */
  static int rotationDegrees(int orientation) {
    switch (orientation) {
      case ExifInterface.ORIENTATION_ROTATE_90:
      case ExifInterface.ORIENTATION_TRANSPOSE:
        return 90;
      case ExifInterface.ORIENTATION_ROTATE_180:
      case ExifInterface.ORIENTATION_FLIP_VERTICAL:
        return 180;
      case ExifInterface.ORIENTATION_ROTATE_270:
      case ExifInterface.ORIENTATION_TRANSVERSE:
        return 270;
      default:
        return 0;
    }
  }

  /** Center square, resized to the manifest's input size, normalized with its mean/std (NCHW, RGB). */
  static float[] modelInput(Bitmap photo, Manifest manifest) {
    int size = manifest.inputSize;
    float[] mean = manifest.normalizationMean;
    float[] std = manifest.normalizationStd;
    if (mean.length != 3 || std.length != 3) {
      throw new IllegalArgumentException(String.format(Locale.ROOT,
          "manifest.json input.normalization has %d means and %d stds, expected 3 (RGB)", mean.length, std.length));
    }
    int side = Math.min(photo.getWidth(), photo.getHeight());
    Bitmap square = Bitmap.createBitmap(photo, (photo.getWidth() - side) / 2, (photo.getHeight() - side) / 2, side, side);
    Bitmap small = Bitmap.createScaledBitmap(square, size, size, true);
    int[] argb = new int[size * size];
    small.getPixels(argb, 0, size, 0, 0, size, size);
    float[] out = new float[3 * size * size];
    for (int i = 0; i < argb.length; i++) {
      int c = argb[i];
      int[] rgb = {(c >> 16) & 0xff, (c >> 8) & 0xff, c & 0xff};
      for (int ch = 0; ch < 3; ch++) {
        out[ch * size * size + i] = (rgb[ch] / 255f - mean[ch]) / std[ch];
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
}
