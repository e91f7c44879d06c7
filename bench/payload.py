"""Bytes per round per device: the base down and up, as fp32/fp16 safetensors and as JSON.

JSON (a list of floats per tensor, as some mobile FL stacks send) is the reference.
Usage: python -m bench.payload
"""

from __future__ import annotations

import json

import numpy as np

from bench.common import write_results
from fedper.common import weights
from fedper.models import ModelConfig, build_model, exchanged_state, split


def main() -> None:
    rows = []
    for alpha in (0.25, 1.0):
        model = build_model(ModelConfig(alpha=alpha, input_size=32), seed=0)
        state = exchanged_state(model)
        base = {n: state[n].numpy() + np.float32(0.01) for n in split(model, 2).base}
        f32 = len(weights.encode(base, {"num_samples": "120", "base_version": "3"}))
        f16 = len(weights.encode(base, {"num_samples": "120", "base_version": "3"}, dtype=np.float16))
        as_json = len(json.dumps({n: t.tolist() for n, t in base.items()}).encode())
        row = {
            "alpha": alpha,
            "base_tensors": len(base),
            "base_parameters": int(sum(t.size for t in base.values())),
            "down_fp32_bytes": f32,
            "up_fp32_bytes": f32,
            "up_fp16_bytes": f16,
            "json_bytes": as_json,
            "json_over_fp32": as_json / f32,
            "json_over_fp16": as_json / f16,
        }
        rows.append(row)
        print(
            f"width {alpha}: base {row['base_parameters']:,} floats; per round per device: down "
            f"{f32 / 1e6:.2f} MB (fp32), up {f32 / 1e6:.2f} MB (fp32) or {f16 / 1e6:.2f} MB (fp16); "
            f"JSON {as_json / 1e6:.2f} MB each way ({row['json_over_fp32']:.1f}x fp32, "
            f"{row['json_over_fp16']:.1f}x fp16)",
            flush=True,
        )
    print("wrote", write_results("payload", {"kp": 2, "rows": rows}))


if __name__ == "__main__":
    main()
