package org.fedper.core;

/** One round's local training settings (the manifest's defaults overridden by the task). */
public final class TrainConfig {
  public final int localEpochs;
  public final int batchSize;
  public final double learningRate;
  public final double momentum;

  public TrainConfig(int localEpochs, int batchSize, double learningRate, double momentum) {
    if (localEpochs < 1 || batchSize < 2) {
      throw new IllegalArgumentException("local_epochs must be >= 1 and batch_size >= 2");
    }
    this.localEpochs = localEpochs;
    this.batchSize = batchSize;
    this.learningRate = learningRate;
    this.momentum = momentum;
  }
}
