package org.fedper.core;

import java.util.Map;

/**
 * What the round loop needs from a training engine. On Android: the exported ExecuTorch training
 * program (android_demo/app's ExecuTorchTrainer); in the host tests: a fake with known tensors.
 */
public interface Trainer {
  /** Loads the server's base tensors (names and shapes as the manifest's "base" list). */
  void setBase(Map<String, Tensor> base) throws Exception;

  /** Loads this device's own head (the manifest's "head" list). */
  void setHead(Map<String, Tensor> head) throws Exception;

  /** Starts a round's training: fresh SGD momentum with this config. */
  void startRound(TrainConfig config) throws Exception;

  /** One SGD step on a batch of at least 2 examples; returns the loss. */
  float trainStep(LocalData.Batch batch) throws Exception;

  Map<String, Tensor> getBase() throws Exception;

  Map<String, Tensor> getHead() throws Exception;

  /** Accuracy on a batch (eval mode, current weights). */
  double evaluate(LocalData.Batch batch) throws Exception;
}
