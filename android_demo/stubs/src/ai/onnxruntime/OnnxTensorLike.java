// API stub (signatures only) of ai.onnxruntime.OnnxTensorLike.
// Mirrors java/src/main/java/ai/onnxruntime/OnnxTensorLike.java (onnxruntime v1.20.0, com.microsoft.onnxruntime:onnxruntime-android 1.20.0).
// Checked against: microsoft/onnxruntime:java/src/main/java/ai/onnxruntime/OnnxTensorLike.java as stored by the audit's code index
// (an undated 2023-copyright version, not the v1.20.0 tag: the repo snapshot is too large to fetch here).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package ai.onnxruntime;

public abstract class OnnxTensorLike implements OnnxValue {
  OnnxTensorLike() {}
}
