package org.fedper.core;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.function.Function;

/**
 * What a phone does each round, the same steps as the Python device (device_runtime/device.py):
 * task, manifest and programs (once, verified by sha256; the manifest pinned once its trainer
 * loaded), base (by ETag, kept per manifest), own head from the head store, evaluate, train,
 * stage the trained head, upload the base, and commit the head only when the server accepted
 * the base. Every wait and every HTTP exchange is within one RoundBudget.
 */
public final class RoundLoop {
  /** One finished round, as the app shows it (accuracies are NaN when the test split is empty). */
  public static final class Report {
    public final long round;
    public final long modelVersion;
    public final int numSamples;
    public final double accuracy;
    public final double accuracyAfter;
    public final double trainLoss;
    public final long received;

    Report(long round, long modelVersion, int numSamples, double accuracy, double accuracyAfter,
        double trainLoss, long received) {
      this.round = round;
      this.modelVersion = modelVersion;
      this.numSamples = numSamples;
      this.accuracy = accuracy;
      this.accuracyAfter = accuracyAfter;
      this.trainLoss = trainLoss;
      this.received = received;
    }
  }

  private final ProtocolClient client;
  private final DeviceStore store;
  private final Function<Manifest, LocalData> data;
  private final TrainerFactory trainers;
  private final RoundBudget budget;
  private final double maxIdleWaitSeconds;
  private final long seed;
  private String deviceId;
  private String enrollmentKey;
  private String platform;
  private long skipRound = -1;
  private boolean finished;

  /** Makes the engine once the programs are on disk (dir holds every artifact the manifest names). */
  public interface TrainerFactory {
    Trainer create(Path artifactDir, Manifest manifest) throws Exception;
  }

  public RoundLoop(ProtocolClient client, DeviceStore store, Function<Manifest, LocalData> data,
      TrainerFactory trainers, RoundBudget budget, double maxIdleWaitSeconds, long seed) {
    this.client = client;
    this.store = store;
    this.data = data;
    this.trainers = trainers;
    this.budget = budget;
    this.maxIdleWaitSeconds = maxIdleWaitSeconds;
    this.seed = seed;
  }

  /**
   * Enrolls once; later runs reuse the stored token. enrollmentKey may be null or empty (an app
   * that ships without one): then a device that has no token, or whose token the server no
   * longer accepts, ends with Unauthorized instead of enrolling.
   */
  public String ensureEnrolled(String enrollmentKey, String platform) throws Exception {
    this.enrollmentKey = enrollmentKey == null || enrollmentKey.isEmpty() ? null : enrollmentKey;
    this.platform = platform;
    String[] saved = store.credentials();
    if (saved == null) {
      return enroll("this device has no token");
    }
    client.setToken(saved[1]);
    deviceId = saved[0];
    return deviceId;
  }

  private String enroll(String why) throws Exception {
    if (enrollmentKey == null) {
      throw new ProtocolException.Unauthorized(Protocol.ErrorCode.UNAUTHORIZED,
          why + ", and the app holds no enrollment key: this phone is no longer enrolled");
    }
    String[] ids = client.enroll(enrollmentKey, platform);
    store.saveCredentials(ids[0], ids[1]);
    deviceId = ids[0];
    return deviceId;
  }

  public String deviceId() {
    return deviceId;
  }

  /** True once the server said the run is finished (410 on a task or an upload). */
  public boolean finished() {
    return finished;
  }

  /**
   * Takes part in rounds until the run is finished (410) or maxRounds rounds were done. On a
   * phone, WorkManager calls this with maxRounds = 1 whenever the phone is charging and idle.
   */
  public List<Report> run(int maxRounds) throws Exception {
    List<Report> reports = new ArrayList<>();
    boolean reenrolled = false;
    while (maxRounds <= 0 || reports.size() < maxRounds) {
      ProtocolClient.TaskOrWait next;
      try {
        next = client.task(SecAggCrypto.supported()); // secure rounds need X25519: API level 33 on
      } catch (ProtocolException.RunFinished done) {
        finished = true;
        break;
      } catch (ProtocolException.Transient ex) {
        budget.sleep(maxIdleWaitSeconds, "the server is unreachable: " + ex.getMessage());
        continue;
      } catch (ProtocolException.Unauthorized ex) {
        reenrolled = reenrollOnce(reenrolled, ex);
        continue;
      }
      if (next.task == null || next.task.round == skipRound) {
        double wait = Math.min(next.task == null ? next.retryAfterSeconds : maxIdleWaitSeconds, maxIdleWaitSeconds);
        budget.sleep(wait, "no task for this device yet");
        continue;
      }
      try {
        reports.add(runRound(next.task));
      } catch (ProtocolException.RunFinished done) { // the operator stopped the run while we trained
        finished = true;
        break;
      } catch (SecAggDevice.RefusedException | java.security.GeneralSecurityException ex) {
        // Revision 1.7: this secure round cannot be taken part in safely (a key list with an
        // invalid or repeated key, a message from a non-neighbour, fewer than t neighbours' shares
        // that open, a malicious unmasking request): out of this round, not out of the run.
        skipRound = next.task.round;
        continue;
      } catch (ProtocolException.NotInCohort ex) { // not a failure: wait and ask again
        budget.sleep(Math.min(ex.retryAfterSeconds, maxIdleWaitSeconds), "not in round " + next.task.round + "'s cohort");
      } catch (ProtocolException.Transient ex) {
        continue; // ask for a task again
      } catch (ProtocolException.Unauthorized ex) {
        reenrolled = reenrollOnce(reenrolled, ex);
      } catch (ProtocolException ex) {
        if (Protocol.ErrorCode.ROUND_NOT_OPEN.equals(ex.code) || Protocol.ErrorCode.STALE_BASE_VERSION.equals(ex.code)
            || Protocol.ErrorCode.SECAGG_STAGE_CLOSED.equals(ex.code)) {
          // Too late for this round (or, in a secure one, left out of its sum): wait for the next one.
          skipRound = next.task.round;
          continue;
        }
        throw ex;
      }
    }
    return reports;
  }

  /**
   * A 401 mid-run (the token was revoked, or the server lost its devices): enroll again, once
   * per run(); a second 401, or no enrollment key, ends the run with Unauthorized.
   */
  private boolean reenrollOnce(boolean already, ProtocolException.Unauthorized ex) throws Exception {
    if (already) {
      throw ex;
    }
    enroll("the server refused this device's token (" + ex.getMessage() + ")");
    return true;
  }

  private Trainer trainer;
  private Manifest manifest;
  private String trainerSha;

  public Report runRound(Task task) throws Exception {
    SecureRound secure = null;
    if (task.secagg != null) { // revision 1.6: keys and shares first (short stages), then the rest
      secure = new SecureRound(client, deviceId, task, budget, maxIdleWaitSeconds);
      secure.share();
    }
    budget.check("loading the training program");
    prepare(task);
    Map<String, Tensor> base = base(task);
    Map<String, Tensor> head = store.heads.load(task.manifestSha256);
    if (head == null) {
      head = initialHead(task.manifestSha256);
    }
    budget.check("loading the photos");
    LocalData local = data.apply(manifest);
    int minBatch = Math.max(2, manifest.minBatch); // a batch of one cannot train BatchNorm
    if (local.trainSize() < minBatch) {
      throw new IllegalStateException("too few examples to train on (" + local.trainSize() + "); rate more photos");
    }
    trainer.setBase(base);
    trainer.setHead(head);
    LocalData.Batch test = local.testSet();
    budget.check("evaluation");
    double accuracy = test.size() == 0 ? Double.NaN : trainer.evaluate(test);
    TrainConfig config = manifest.trainConfig(task.config);
    budget.check("training");
    trainer.startRound(config);
    Random order = new Random(seed * 1_000_003L + task.round);
    double lossSum = 0;
    int steps = 0;
    for (int epoch = 0; epoch < config.localEpochs; epoch++) {
      int[] perm = permutation(local.trainSize(), order);
      for (int start = 0; start + minBatch <= perm.length; start += config.batchSize) {
        int end = Math.min(perm.length, start + config.batchSize);
        if (end - start < minBatch) {
          break; // smaller than the training program accepts
        }
        int[] idx = new int[end - start];
        System.arraycopy(perm, start, idx, 0, idx.length);
        budget.check("training step " + (steps + 1));
        lossSum += trainer.trainStep(local.trainBatch(idx));
        steps++;
      }
    }
    budget.check("evaluation after training");
    double accuracyAfter = test.size() == 0 ? Double.NaN : trainer.evaluate(test);
    // Staged, not saved: if the upload is not accepted, the next attempt starts from the head
    // the last accepted round left, so these photos do not train the head twice.
    store.heads.stage(task.manifestSha256, only(trainer.getHead(), manifest.headNames()));
    // A head-only export trains only the head: the base goes back exactly as it came.
    Map<String, Tensor> update = only("head".equals(manifest.trainable) ? base : trainer.getBase(), manifest.baseNames());
    double loss = steps == 0 ? Double.NaN : lossSum / steps;
    budget.check("the upload"); // stopped or out of time: nothing goes out, the head stays staged
    if (secure != null) { // the masked update, then the unmasking: nothing in the clear
      secure.sendMasked(update, base, manifest.baseNames(), local.trainSize());
      budget.check("the unmasking");
      secure.unmask();
      // Only now is this device's input in the sum: a round that loses it (the unmasking missed,
      // its input left out) leaves the head as it was, as a refused upload does.
      store.heads.commit(task.manifestSha256);
      return new Report(task.round, task.modelVersion, local.trainSize(), accuracy, accuracyAfter, loss, -1);
    }
    Map<String, String> meta = new LinkedHashMap<>();
    meta.put(Protocol.Metadata.NUM_SAMPLES, Integer.toString(local.trainSize()));
    meta.put(Protocol.Metadata.BASE_VERSION, Long.toString(task.modelVersion));
    if (task.clipNorm != null) { // DP-FedAvg: the server checks the clip, measured as here
      DeltaClipping.Clipped clipped = DeltaClipping.clip(update, base, manifest.baseNames(), task.clipNorm);
      update = clipped.tensors;
      meta.put(Protocol.Metadata.UNCLIPPED, clipped.unclipped ? "1" : "0");
    }
    putMetric(meta, "accuracy", accuracy);
    putMetric(meta, "accuracy_after", accuracyAfter);
    putMetric(meta, "train_loss", loss);
    long received = client.upload(task.round, Safetensors.write(update, meta));
    store.heads.commit(task.manifestSha256); // 202, or duplicate_update: the server has this round's base
    return new Report(task.round, task.modelVersion, local.trainSize(), accuracy, accuracyAfter, loss, received);
  }

  /**
   * Adds metric.NAME unless the value is undefined: the server refuses a non-finite metric (or
   * one beyond Protocol.Metadata.MAX_METRIC_ABS) with bad_metadata, losing the round's work; an
   * empty test split has no accuracy, so it sends none.
   */
  static void putMetric(Map<String, String> meta, String name, double value) {
    if (Double.isFinite(value) && Math.abs(value) <= Protocol.Metadata.MAX_METRIC_ABS) {
      meta.put(Protocol.Metadata.METRIC_PREFIX + name, Double.toString(value));
    }
  }

  private void prepare(Task task) throws Exception {
    String sha = task.manifestSha256;
    if (sha.equals(trainerSha)) {
      return;
    }
    Path dir = store.artifactDir(sha);
    Path manifestPath = dir.resolve("manifest.json");
    if (!Files.exists(manifestPath)) {
      AtomicFiles.write(manifestPath, client.downloadVerified(task.manifestUrl, sha));
    }
    Manifest m = Manifest.parse(new String(Files.readAllBytes(manifestPath), StandardCharsets.UTF_8));
    String pinned = store.pinnedManifest();
    if (pinned != null && !pinned.equals(sha)) {
      Path old = store.artifactDir(pinned).resolve("manifest.json");
      if (Files.exists(old)) {
        Manifest before = Manifest.parse(new String(Files.readAllBytes(old), StandardCharsets.UTF_8));
        for (String name : before.headNames()) {
          if (m.base.containsKey(name)) {
            throw new ProtocolException(200, "manifest_conflict",
                "the new manifest would upload " + name + ", which this device keeps personal");
          }
        }
      }
    }
    for (String name : new java.util.LinkedHashSet<>(m.artifacts.values())) {
      Path file = dir.resolve(name);
      String want = m.sha256.get(name);
      if (!Files.exists(file) || !ProtocolClient.sha256Hex(Files.readAllBytes(file)).equals(want)) {
        AtomicFiles.write(file, client.downloadVerified(Protocol.Path.ARTIFACT.replace("{name}", name), want));
      }
    }
    Trainer created = trainers.create(dir, m); // a runtime that cannot load the programs throws here
    store.pinManifest(sha); // pinned only once a trainer of it loaded
    manifest = m;
    trainer = created;
    trainerSha = sha;
  }

  private Map<String, Tensor> base(Task task) throws Exception {
    String etag = store.baseEtag(task.manifestSha256, task.modelVersion);
    ProtocolClient.Download d = client.download(task.baseUrl, etag);
    if (d.body != null) {
      store.saveBase(task.manifestSha256, task.modelVersion, d.body, d.etag);
    }
    return store.readBase(task.manifestSha256, task.modelVersion, manifest);
  }

  private Map<String, Tensor> initialHead(String sha) throws IOException {
    return Manifest.readChecked(store.artifactDir(sha).resolve(manifest.artifacts.get("initial_head")), manifest.head);
  }

  private static Map<String, Tensor> only(Map<String, Tensor> tensors, List<String> names) {
    Map<String, Tensor> out = new LinkedHashMap<>();
    for (String n : names) {
      Tensor t = tensors.get(n);
      if (t == null) {
        throw new IllegalStateException("the trainer did not return tensor " + n);
      }
      out.put(n, t);
    }
    return out;
  }

  private static int[] permutation(int n, Random rng) {
    int[] p = new int[n];
    for (int k = 0; k < n; k++) {
      p[k] = k;
    }
    for (int k = n - 1; k > 0; k--) {
      int j = rng.nextInt(k + 1);
      int tmp = p[k];
      p[k] = p[j];
      p[j] = tmp;
    }
    return p;
  }
}
