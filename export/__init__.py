"""The export pipeline: torch models to ExecuTorch training/inference programs, ONNX, manifest."""
