package org.fedper.demo;

import android.net.Uri;
import android.os.Bundle;
import android.widget.Button;
import android.widget.ImageView;
import android.widget.RatingBar;
import android.widget.TextView;
import androidx.activity.result.ActivityResultLauncher;
import androidx.activity.result.contract.ActivityResultContracts;
import androidx.appcompat.app.AppCompatActivity;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.fedper.core.DeviceStore;
import org.fedper.core.Manifest;
import org.fedper.core.Safetensors;
import org.fedper.core.Tensor;

/** Rate photos from the gallery, score a new one with this phone's personal model, see rounds. */
public final class MainActivity extends AppCompatActivity {
  private final ExecutorService background = Executors.newSingleThreadExecutor();
  private TextView status;
  private ImageView photo;
  private RatingBar rating;
  private Uri picked;
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
          picked = uri;
          photo.setImageURI(uri);
          if (scoring) {
            background.execute(this::score);
          }
        });
    Button rate = findViewById(R.id.rate);
    rate.setOnClickListener(v -> {
      if (picked == null) {
        scoring = false;
        pick.launch("image/*");
      } else {
        background.execute(this::saveRating);
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

  /** The pinned manifest, once the first round downloaded it. */
  private Manifest manifest(DeviceStore store) throws Exception {
    String sha = store.pinnedManifest();
    if (sha == null) {
      return null;
    }
    Path m = store.artifactDir(sha).resolve("manifest.json");
    return Manifest.parse(new String(Files.readAllBytes(m), StandardCharsets.UTF_8));
  }

  private void saveRating() {
    try {
      PhotoRatings.add(this, picked, Math.max(1, Math.round(rating.getRating())));
      picked = null;
      int legacy = PhotoRatings.legacyCount(this);
      showStatus("saved; " + PhotoRatings.kept(this).size() + " photos rated"
          + (legacy > 0 ? "; " + legacy + " photos rated by an older version must be rated again" : ""));
    } catch (Exception ex) {
      showStatus("could not save the rating: " + ex.getMessage());
    }
  }

  private void score() {
    try {
      DeviceStore store = RoundWorker.store(this);
      Manifest m = manifest(store);
      if (m == null) {
        showStatus("no model yet: take part in a round first");
        return;
      }
      String sha = store.pinnedManifest();
      Path dir = store.artifactDir(sha);
      Map<String, Tensor> weights = new LinkedHashMap<>();
      // The newest base this phone downloaded, and its own head (or the export's initial head).
      long latest = store.latestBaseVersion();
      Path base = latest >= 0 ? store.basePath(latest) : dir.resolve(m.artifacts.get("initial_base"));
      weights.putAll(Safetensors.read(Files.readAllBytes(base)).tensors);
      Map<String, Tensor> head = store.heads.load(sha);
      weights.putAll(head != null ? head : Safetensors.read(Files.readAllBytes(dir.resolve(m.artifacts.get("initial_head")))).tensors);
      try (OnnxScorer scorer = new OnnxScorer(dir.resolve(m.artifacts.get("onnx_model")), m)) {
        float[] logits = scorer.logits(PhotoRatings.pixels(this, picked, m), weights);
        showStatus(String.format(java.util.Locale.ROOT, "your taste predicts %.1f / 5 for this photo",
            OnnxScorer.expectedRating(logits)));
      }
      picked = null;
    } catch (Exception ex) {
      showStatus("could not score: " + ex.getMessage());
    }
  }

  private void showStatus(String message) {
    String last = getSharedPreferences(RoundWorker.PREFS, MODE_PRIVATE).getString("last", "no round yet");
    String text = (message == null ? "" : message + "\n") + "last round: " + last;
    runOnUiThread(() -> status.setText(text));
  }
}
