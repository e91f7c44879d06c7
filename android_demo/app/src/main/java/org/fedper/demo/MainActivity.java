package org.fedper.demo;

import android.graphics.Bitmap;
import android.net.Uri;
import android.os.Bundle;
import android.widget.Button;
import android.widget.ImageView;
import android.widget.RatingBar;
import android.widget.TextView;
import androidx.activity.result.ActivityResultLauncher;
import androidx.activity.result.contract.ActivityResultContracts;
import androidx.appcompat.app.AppCompatActivity;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.fedper.core.DeviceStore;
import org.fedper.core.Manifest;
import org.fedper.core.Tensor;

/**
 * Rate photos from the gallery, score a new one with this phone's personal model, see rounds.
 * Threads: the views and the fields below are touched on the UI thread only. Slow work (decoding,
 * saving, scoring) runs on {@link #background} and gets what it needs as arguments, read on the UI
 * thread when it is submitted; it posts results back through {@link #onUi}.
 */
public final class MainActivity extends AppCompatActivity {
  /**
   * Longest side of the on-screen preview: enough for the full-width, 240dp-high view on a phone
   * 1080-1440 px wide, and about 6 MB as a bitmap where a 50 MP photo decoded whole is 200 MB.
   */
  private static final int PREVIEW_SIDE = 1280;
  private final ExecutorService background = Executors.newSingleThreadExecutor();
  private TextView status;
  private ImageView photo;
  private RatingBar rating;
  /** The photo the next tap on "rate" saves a rating for (null: that tap picks one). UI thread only. */
  private Uri picked;
  /** Whether the gallery pick under way is for scoring (else for rating). UI thread only. */
  private boolean scoring;

  @Override
  protected void onCreate(Bundle savedInstanceState) {
    super.onCreate(savedInstanceState);
    setContentView(R.layout.activity_main);
    status = findViewById(R.id.status);
    photo = findViewById(R.id.photo);
    rating = findViewById(R.id.rating);
    ActivityResultLauncher<String> pick = registerForActivityResult(
        new ActivityResultContracts.GetContent(), uri -> {
          if (uri == null) {
            return;
          }
          showPreview(uri);
          if (scoring) {
            picked = null; // a scored photo is not the one "rate" saves
            background.execute(() -> score(uri));
          } else {
            picked = uri;
          }
        });
    Button rate = findViewById(R.id.rate);
    rate.setOnClickListener(v -> {
      if (picked == null) {
        scoring = false;
        pick.launch("image/*");
      } else {
        Uri chosen = picked;
        int stars = Math.min(PhotoRatings.RATING_LEVELS, Math.max(1, Math.round(rating.getRating())));
        background.execute(() -> saveRating(chosen, stars));
      }
    });
    ((Button) findViewById(R.id.score)).setOnClickListener(v -> {
      scoring = true;
      pick.launch("image/*");
    });
    ((Button) findViewById(R.id.round_now)).setOnClickListener(v -> RoundWorker.runNow(this));
    RoundWorker.schedule(this);
    showStatus(null);
  }

  /**
   * Stops the background thread with the activity. shutdown, not shutdownNow: a rating tapped just
   * before leaving (or turning the phone, which also destroys the activity) is still saved, where an
   * interrupt could abort its write; what the remaining tasks post back is dropped by onUi.
   */
  @Override
  protected void onDestroy() {
    super.onDestroy();
    background.shutdown();
  }

  /** Runs action on the UI thread unless the activity is destroyed by then (its views are gone). */
  private void onUi(Runnable action) {
    runOnUiThread(() -> {
      if (!isDestroyed()) {
        action.run();
      }
    });
  }

  /** Shows a bounded, upright preview, decoded off the UI thread (never the full camera image). */
  private void showPreview(Uri uri) {
    background.execute(() -> {
      try {
        Bitmap preview = PhotoRatings.decodeUpright(this, uri, PREVIEW_SIDE);
        onUi(() -> photo.setImageBitmap(preview));
      } catch (Exception ex) {
        onUi(() -> {
          photo.setImageBitmap(null);
          if (picked == uri) {
            picked = null; // this pick, not a later one: "rate" picks again instead of failing
          }
        });
        showStatus("could not open the photo: " + ex.getMessage());
      }
    });
  }

  /** The pinned manifest, once the first round downloaded it. */
  private Manifest manifest(DeviceStore store) throws Exception {
    String sha = store.pinnedManifest();
    if (sha == null) {
      return null;
    }
    Path m = store.artifactDir(sha).resolve("manifest.json");
    return Manifest.parse(new String(Files.readAllBytes(m), StandardCharsets.UTF_8));
  }

  private void saveRating(Uri uri, int stars) {
    try {
      PhotoRatings.add(this, uri, stars);
      onUi(() -> {
        if (picked == uri) {
          picked = null; // this pick, not a later one
        }
      });
      int legacy = PhotoRatings.legacyCount(this);
      showStatus("saved; " + PhotoRatings.kept(this).size() + " photos rated"
          + (legacy > 0 ? "; " + legacy + " photos rated by an older version must be rated again" : ""));
    } catch (Exception ex) {
      showStatus("could not save the rating: " + ex.getMessage());
    }
  }

  private void score(Uri uri) {
    try {
      DeviceStore store = RoundWorker.store(this);
      Manifest m = manifest(store);
      if (m == null) {
        showStatus("no model yet: take part in a round first");
        return;
      }
      PhotoRatings.requireRatingScale(m);
      String sha = store.pinnedManifest();
      Path dir = store.artifactDir(sha);
      Map<String, Tensor> weights = new LinkedHashMap<>();
      // This manifest's newest downloaded base (a base of another export is never used: versions
      // restart at 0 in every run) and this phone's head, or the export's initial ones; each
      // refused unless its names and shapes are the manifest's.
      long latest = store.latestBaseVersion(sha);
      if (latest >= 0) {
        weights.putAll(store.readBase(sha, latest, m));
      } else {
        weights.putAll(Manifest.readChecked(dir.resolve(m.artifacts.get("initial_base")), m.base));
      }
      Map<String, Tensor> head = store.heads.load(sha);
      weights.putAll(head != null ? head : Manifest.readChecked(dir.resolve(m.artifacts.get("initial_head")), m.head));
      try (OnnxScorer scorer = new OnnxScorer(dir.resolve(m.artifacts.get("onnx_model")), m)) {
        float[] logits = scorer.logits(PhotoRatings.pixels(this, uri, m), weights);
        if (logits.length != PhotoRatings.RATING_LEVELS) {
          // expectedRating weighs class k as rating k + 1: only meaningful on the rating scale
          throw new IOException("the ONNX model gave " + logits.length + " scores; manifest.json says "
              + m.numClasses + " classes");
        }
        showStatus(String.format(Locale.ROOT, "your taste predicts %.1f / %d for this photo",
            OnnxScorer.expectedRating(logits), PhotoRatings.RATING_LEVELS));
      }
    } catch (Exception ex) {
      showStatus("could not score: " + ex.getMessage());
    }
  }

  /** Shows message (or nothing) above the last round's outcome; any thread. */
  private void showStatus(String message) {
    String last = getSharedPreferences(RoundWorker.PREFS, MODE_PRIVATE).getString("last", "no round yet");
    String text = (message == null ? "" : message + "\n") + "last round: " + last;
    onUi(() -> status.setText(text));
  }
}
