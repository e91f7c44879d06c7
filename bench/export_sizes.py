"""Export sizes and times for MobileNet-V1 width 0.25 and 1.0 at 32 and 224 input.

Usage: python -m bench.export_sizes [--sizes 32,224] [--alphas 0.25,1.0]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import write_results
from fedper.export.pipeline import ExportConfig, run_export
from fedper.models import ModelConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="32,224")
    parser.add_argument("--alphas", default="0.25,1.0")
    parser.add_argument("--variant", default=None, help="training graph variant (default: the export default)")
    args = parser.parse_args()
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                kwargs = {"variant": args.variant} if args.variant else {}
                config = ExportConfig(model=ModelConfig(alpha=alpha, input_size=size), out=Path(tmp) / "a", **kwargs)
                report = run_export(config)
                row = {
                    "alpha": alpha,
                    "input_size": size,
                    "variant": report.manifest.training_program.variant,
                    "sizes": report.sizes,
                    "seconds": {k: round(v, 1) for k, v in report.seconds.items()},
                }
            rows.append(row)
            sizes = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in row["sizes"].items())
            print(f"alpha {alpha} input {size}: {row['seconds']['total']} s; {sizes}", flush=True)
    print("wrote", write_results("export_sizes", {"rows": rows}))


if __name__ == "__main__":
    main()
