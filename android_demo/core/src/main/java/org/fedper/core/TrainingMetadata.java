package org.fedper.core;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * What a device checks of the training program against manifest.json's training_program before
 * it trains with it, as the Python device's check_training_metadata does: the calling convention
 * the trainer relies on (inputs "x", "y", then the BatchNorm statistics; outputs "loss", then the
 * same statistics), and what the loaded program hands out (its parameters and their gradients, by
 * name and shape, and the number and shapes of its outputs). A program that miscounts its outputs
 * (ExecuTorch 1.5.1's index bug with mutated buffers) would otherwise return the wrong tensors
 * silently. Every refusal names the field or tensor and what was expected.
 */
public final class TrainingMetadata {
  private TrainingMetadata() {}

  /** Refuses a manifest whose training_program the trainer cannot call as it does. */
  public static void checkCallingConvention(Manifest m) {
    List<String> inputs = new ArrayList<>(Arrays.asList("x", "y"));
    inputs.addAll(m.bnStatistics);
    if (!m.trainingInputs.equals(inputs)) {
      throw new IllegalArgumentException("manifest.json training_program.inputs is " + m.trainingInputs
          + "; expected \"x\", \"y\", then training_program.bn_statistics in order");
    }
    List<String> outputs = new ArrayList<>();
    outputs.add("loss");
    outputs.addAll(m.bnStatistics);
    if (!m.trainingOutputs.equals(outputs)) {
      throw new IllegalArgumentException("manifest.json training_program.outputs is " + m.trainingOutputs
          + "; expected \"loss\", then training_program.bn_statistics in order");
    }
    Set<String> parameters = new HashSet<>();
    for (String name : m.trainingParameters) {
      if (!parameters.add(name)) {
        throw new IllegalArgumentException("manifest.json training_program.parameters lists " + name + " twice");
      }
    }
    Set<String> statistics = new HashSet<>();
    for (String name : m.bnStatistics) {
      if (!statistics.add(name) || parameters.contains(name)) {
        throw new IllegalArgumentException("manifest.json training_program.bn_statistics: " + name
            + " is listed twice or is also a parameter");
      }
    }
    Set<String> tensors = new HashSet<>(m.base.keySet());
    tensors.addAll(m.head.keySet());
    Set<String> program = new HashSet<>(parameters);
    program.addAll(statistics);
    if (!program.equals(tensors)) {
      throw new IllegalArgumentException("manifest.json: training_program.parameters and bn_statistics are not the"
          + " base and head tensors: " + differences(tensors, program));
    }
  }

  /**
   * Refuses a loaded program whose parameters, gradients or outputs (after one forward and
   * backward) are not what the manifest says. {@code outputShapes}: the method's outputs, in order.
   */
  public static void checkProgram(Manifest m, Map<String, long[]> parameters, Map<String, long[]> gradients,
      List<long[]> outputShapes) {
    Set<String> expected = new HashSet<>(m.trainingParameters);
    if (!parameters.keySet().equals(expected)) {
      throw new IllegalStateException("train.pte's parameters are not manifest.json's training_program.parameters: "
          + differences(expected, parameters.keySet()));
    }
    if (!gradients.keySet().equals(expected)) {
      throw new IllegalStateException("train.pte's gradients are not of manifest.json's training_program.parameters: "
          + differences(expected, gradients.keySet()));
    }
    for (String name : m.trainingParameters) {
      long[] shape = shapeOf(m, name);
      same(shape, parameters.get(name), "parameter " + name);
      same(shape, gradients.get(name), "the gradient of " + name);
    }
    if (outputShapes.size() != m.trainingOutputs.size()) {
      throw new IllegalStateException("train.pte's method " + m.trainingMethod + " returned " + outputShapes.size()
          + " outputs; manifest.json training_program.outputs lists " + m.trainingOutputs.size()
          + " (the ExecuTorch index bug: re-export with fedper export)");
    }
    same(new long[0], outputShapes.get(0), "output loss");
    for (int k = 0; k < m.bnStatistics.size(); k++) {
      String name = m.bnStatistics.get(k);
      same(shapeOf(m, name), outputShapes.get(k + 1), "output " + name);
    }
  }

  private static long[] shapeOf(Manifest m, String name) {
    return m.base.containsKey(name) ? m.base.get(name) : m.head.get(name);
  }

  private static void same(long[] expected, long[] got, String what) {
    if (!Arrays.equals(expected, got)) {
      throw new IllegalStateException("train.pte's " + what + " has shape " + Arrays.toString(got)
          + "; manifest.json says " + Arrays.toString(expected));
    }
  }

  private static String differences(Set<String> expected, Set<String> got) {
    Set<String> missing = new TreeSet<>(expected);
    missing.removeAll(got);
    Set<String> extra = new TreeSet<>(got);
    extra.removeAll(expected);
    return "missing " + missing + ", unexpected " + extra;
  }
}
