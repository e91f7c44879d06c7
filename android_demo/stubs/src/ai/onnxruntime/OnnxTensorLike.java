// API stub (signatures only) of ai.onnxruntime.OnnxTensorLike.
// Mirrors java/src/main/java/ai/onnxruntime/OnnxTensorLike.java (onnxruntime v1.20.0 (com.microsoft.onnxruntime:onnxruntime-android 1.20.0); checked against microsoft/onnxruntime java/src/main/java/ai/onnxruntime/).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package ai.onnxruntime;

public abstract class OnnxTensorLike implements OnnxValue {
  OnnxTensorLike() {}
}
