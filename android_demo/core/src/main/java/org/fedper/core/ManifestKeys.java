package org.fedper.core;

/** FedPer export manifest (fedper-manifest/1): its field names, generated from docs/manifest.schema.json by
 * android_demo/core/generate_protocol.py; do not edit. */
public final class ManifestKeys {
  private ManifestKeys() {}

  public static final String FORMAT = "fedper-manifest/1";

  public static final class InferenceProgramSpec {
    private InferenceProgramSpec() {}

    public static final String BATCH = "batch";
    public static final int BATCH_DEFAULT = 1;
    public static final String METHOD = "method";
    public static final String METHOD_DEFAULT = "forward";
    public static final String WEIGHTS = "weights";
  }

  public static final class InputSpec {
    private InputSpec() {}

    public static final String CHANNELS = "channels";
    public static final String DTYPE = "dtype";
    public static final String LAYOUT = "layout";
    public static final String NORMALIZATION = "normalization";
    public static final String SHAPE = "shape";
  }

  public static final class Manifest {
    private Manifest() {}

    public static final String ARTIFACTS = "artifacts";
    public static final String CREATED_BY = "created_by";
    public static final String FORMAT = "format";
    public static final String INFERENCE_PROGRAM = "inference_program";
    public static final String INPUT = "input";
    public static final String KP = "kp";
    public static final String MODEL = "model";
    public static final String OUTPUT = "output";
    public static final String RUNTIME = "runtime";
    public static final String SHA256 = "sha256";
    public static final String TENSORS = "tensors";
    public static final String TRAINING = "training";
    public static final String TRAINING_PROGRAM = "training_program";
  }

  public static final class ModelSpec {
    private ModelSpec() {}

    public static final String ALPHA = "alpha";
    public static final String BASE = "base";
    public static final String BASE_DEFAULT = "model";
    public static final String HEAD = "head";
    public static final String[] HEAD_CHOICES = {"softmax", "ordinal"};
    public static final String HEAD_DEFAULT = "softmax";
    public static final String HEAD_MODULES = "head_modules";
    public static final String INPUT_SIZE = "input_size";
    public static final String LINEAR_BASE_KP = "linear_base_kp";
    public static final int LINEAR_BASE_KP_DEFAULT = 0;
    public static final String MODEL_ARGS = "model_args";
    public static final String NAME = "name";
    public static final String NUM_CLASSES = "num_classes";
  }

  public static final class Normalization {
    private Normalization() {}

    public static final String MEAN = "mean";
    public static final String STD = "std";
  }

  public static final class OutputSpec {
    private OutputSpec() {}

    public static final String KIND = "kind";
    public static final String LABELS = "labels";
    public static final String NUM_CLASSES = "num_classes";
  }

  public static final class RuntimeSpec {
    private RuntimeSpec() {}

    public static final String EXECUTORCH = "executorch";
    public static final String ONNX_OPSET = "onnx_opset";
  }

  public static final class TensorEntry {
    private TensorEntry() {}

    public static final String DTYPE = "dtype";
    public static final String NAME = "name";
    public static final String SHAPE = "shape";
  }

  public static final class Tensors {
    private Tensors() {}

    public static final String BASE = "base";
    public static final String HEAD = "head";
  }

  public static final class TrainingDefaults {
    private TrainingDefaults() {}

    public static final String BATCH_SIZE = "batch_size";
    public static final int BATCH_SIZE_DEFAULT = 32;
    public static final String LEARNING_RATE = "learning_rate";
    public static final double LEARNING_RATE_DEFAULT = 0.01;
    public static final String LOCAL_EPOCHS = "local_epochs";
    public static final int LOCAL_EPOCHS_DEFAULT = 1;
    public static final String LOSS = "loss";
    public static final String MOMENTUM = "momentum";
    public static final double MOMENTUM_DEFAULT = 0.9;
    public static final String OPTIMIZER = "optimizer";
    public static final String TRAINABLE = "trainable";
    public static final String[] TRAINABLE_CHOICES = {"all", "head"};
    public static final String TRAINABLE_DEFAULT = "all";
  }

  public static final class TrainingProgramSpec {
    private TrainingProgramSpec() {}

    public static final String BN_STATISTICS = "bn_statistics";
    public static final String INPUTS = "inputs";
    public static final String MAX_BATCH = "max_batch";
    public static final String METHOD = "method";
    public static final String METHOD_DEFAULT = "forward";
    public static final String MIN_BATCH = "min_batch";
    public static final int MIN_BATCH_DEFAULT = 2;
    public static final String OUTPUTS = "outputs";
    public static final String PARAMETERS = "parameters";
    public static final String VARIANT = "variant";
    public static final String[] VARIANT_CHOICES = {"fast", "plain"};
  }
}
