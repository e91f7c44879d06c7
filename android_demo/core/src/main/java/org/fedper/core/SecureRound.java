package org.fedper.core;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * The app's part in a secure round (protocol revision 1.7: PROTOCOL.md "Secure aggregation",
 * docs/SECAGG.md), as the Python device's device_runtime/secure_round.py: keys and shares before
 * it trains, its masked update after (naming the neighbours whose shares did not open), its answer
 * to the unmasking. The update never leaves the phone in the clear.
 */
final class SecureRound {
  private final ProtocolClient client;
  private final Task task;
  private final RoundBudget budget;
  private final double maxWaitSeconds;
  private final SecAggDevice session;

  SecureRound(ProtocolClient client, String deviceId, Task task, RoundBudget budget, double maxWaitSeconds)
      throws Exception {
    this.client = client;
    this.task = task;
    this.budget = budget;
    this.maxWaitSeconds = maxWaitSeconds;
    byte[] context = task.secagg.session.getBytes(StandardCharsets.US_ASCII);
    this.session = new SecAggDevice(deviceId, context, new SecureRandom());
  }

  private JsonFields waitFor(String path) throws Exception {
    double[] retry = new double[1];
    while (true) {
      JsonFields answer = client.secaggFetch(path, task.round, retry);
      if (answer != null) {
        return answer;
      }
      budget.sleep(Math.min(retry[0], maxWaitSeconds), "waiting for the secure round's next stage");
    }
  }

  private static String b64(byte[] data) {
    return Base64.getEncoder().encodeToString(data);
  }

  /** A relayed value's bytes; what is not base64 only a broken or malicious server sends. */
  private static byte[] bytes(String text) {
    try {
      return Base64.getDecoder().decode(text);
    } catch (IllegalArgumentException ex) {
      throw new SecAggDevice.RefusedException("a relayed value is not base64: " + ex.getMessage(), ex);
    }
  }

  private static byte[] json(JSONObject body) {
    return body.toString().getBytes(StandardCharsets.UTF_8);
  }

  /** Advertise the keys, seal the shares for the neighbours, keep theirs. */
  void share() throws Exception {
    SecAggDevice.Advertisement own = session.advertise();
    JSONObject keys = new JSONObject();
    keys.put(Protocol.Body.SecAggKeys.CHANNEL_KEY, b64(own.channel));
    keys.put(Protocol.Body.SecAggKeys.MASK_KEY, b64(own.mask));
    client.secaggSend(Protocol.Path.SECAGG_KEYS, task.round, json(keys), true);
    JsonFields relayed = waitFor(Protocol.Path.SECAGG_KEYS);
    JsonFields listed = relayed.object(Protocol.Body.SecAggNeighbours.NEIGHBOURS);
    Map<String, SecAggDevice.Advertisement> neighbours = new TreeMap<>();
    for (Iterator<String> it = listed.json().keys(); it.hasNext(); ) {
      String id = it.next();
      JsonFields k = listed.object(id);
      neighbours.put(id, new SecAggDevice.Advertisement(bytes(k.string(Protocol.Body.SecAggKeys.CHANNEL_KEY)),
          bytes(k.string(Protocol.Body.SecAggKeys.MASK_KEY))));
    }
    int threshold = (int) relayed.integer(Protocol.Body.SecAggNeighbours.THRESHOLD);
    if (threshold != task.secagg.threshold || neighbours.size() > task.secagg.neighbours) {
      throw new SecAggDevice.RefusedException("the server relayed " + neighbours.size() + " neighbours at threshold "
          + threshold + "; the task said at most " + task.secagg.neighbours + " at " + task.secagg.threshold);
    }
    Map<String, byte[]> sealed = session.shareKeys(neighbours, threshold);
    JSONObject shares = new JSONObject();
    for (Map.Entry<String, byte[]> e : sealed.entrySet()) {
      shares.put(e.getKey(), b64(e.getValue()));
    }
    client.secaggSend(Protocol.Path.SECAGG_SHARES, task.round,
        json(new JSONObject().put(Protocol.Body.SecAggSealed.SHARES, shares)), true);
    Map<String, String> received = waitFor(Protocol.Path.SECAGG_SHARES).stringMap(Protocol.Body.SecAggSealed.SHARES);
    Map<String, byte[]> ciphertexts = new TreeMap<>();
    for (Map.Entry<String, String> e : received.entrySet()) {
      ciphertexts.put(e.getKey(), bytes(e.getValue()));
    }
    session.receiveShares(ciphertexts);
  }

  /**
   * The base delta clipped to the task's norm (PROTOCOL.md, "Clipping the base delta"), in the
   * manifest's base order, encoded (under DP with the unclipped bit) and masked, then sent.
   */
  void sendMasked(Map<String, Tensor> trained, Map<String, Tensor> received, List<String> names, long numSamples)
      throws Exception {
    DeltaClipping.Clipped clipped = DeltaClipping.clip(trained, received, names, task.secagg.clipNorm);
    int size = 0;
    for (String n : names) {
      size += received.get(n).data().length;
    }
    double[] delta = new double[size];
    int at = 0;
    for (String n : names) {
      float[] t = clipped.tensors.get(n).data();
      float[] b = received.get(n).data();
      for (int k = 0; k < t.length; k++) {
        delta[at++] = (double) t[k] - (double) b[k];
      }
    }
    boolean dp = task.clipNorm != null;
    FixedPoint fixed = new FixedPoint(task.secagg.clipNorm, task.secagg.cohort, task.secagg.weightCap, dp ? 1 : 0);
    int[] words = fixed.encode(delta, numSamples, dp ? new int[] {clipped.unclipped ? 1 : 0} : new int[0]);
    int[] masked = session.maskedInput(words);
    ByteBuffer out = ByteBuffer.allocate(4 * masked.length).order(ByteOrder.LITTLE_ENDIAN);
    out.asIntBuffer().put(masked);
    Map<String, String> headers = new TreeMap<>();
    if (!session.unopened().isEmpty()) { // what lets the server leave a pair out consistently
      headers.put(Protocol.Header.SECAGG_UNOPENED, String.join(",", session.unopened()));
    }
    client.secaggSend(Protocol.Path.SECAGG_MASKED, task.round, out.array(), false, headers);
  }

  /** Answer the server's one unmasking request (the session refuses a malicious one). */
  void unmask() throws Exception {
    JsonFields request = waitFor(Protocol.Path.SECAGG_UNMASK);
    Map<String, byte[]> answer = session.unmask(request.strings(Protocol.Body.SecAggUnmaskRequest.DROPPED),
        request.strings(Protocol.Body.SecAggUnmaskRequest.SURVIVORS));
    JSONObject shares = new JSONObject();
    for (Map.Entry<String, byte[]> e : answer.entrySet()) {
      shares.put(e.getKey(), b64(e.getValue()));
    }
    try {
      client.secaggSend(Protocol.Path.SECAGG_UNMASK, task.round,
          json(new JSONObject().put(Protocol.Body.SecAggUnmaskAnswer.SHARES, shares)), true);
    } catch (JSONException ex) {
      throw new IllegalStateException(ex);
    }
  }
}
