"""Where the export's time goes, pass by pass: every lowering pass of ExecuTorch and XNNPACK timed,
and whether it changed the ops of the graph it was given.

One export of the default training program (width 0.25, 32 px unless given), with
``torch.fx.passes.infra.pass_base.PassBase.__call__`` wrapped: each outermost pass call is timed
and the graph's ops (every node's kind and target, counted) compared before and after. A pass
that changes no op and re-traces thousands of nodes is a candidate to skip
(``export/unchanging_passes.py``); ``--no-shortcuts`` shows them all, as ExecuTorch runs them.

Usage: python -m bench.export_passes [--alpha 0.25] [--input-size 32] [--no-shortcuts]
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from bench.common import write_results

# XNNPACK's per-partition passes: hundreds of small calls, summed by name.
PER_PARTITION = ("ConvertToLinearPass", "FuseActivationPass", "DecomposeConcatenate")


def _ops(graph_module: torch.fx.GraphModule) -> collections.Counter[tuple[str, str]]:
    def nodes() -> Iterator[torch.fx.Node]:
        for module in graph_module.modules():
            if isinstance(module, torch.fx.GraphModule):
                yield from module.graph.nodes

    return collections.Counter((node.op, str(node.target)) for node in nodes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--no-shortcuts", action="store_true", help="every pass, as ExecuTorch runs them")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from torch.fx.passes.infra import pass_base

    from fedper.export.executorch_lowering import lower_training_program
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    changed: dict[str, bool] = {}
    depth = [0]
    original = pass_base.PassBase.__call__

    def timed(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        name = type(self).__name__
        outermost = depth[0] == 0
        before = _ops(graph_module) if outermost and name not in PER_PARTITION else None
        depth[0] += 1
        start = time.perf_counter()
        try:
            result = original(self, graph_module)
        finally:
            depth[0] -= 1
        if outermost:
            seconds[name] += time.perf_counter() - start
            calls[name] += 1
            if before is not None:
                after = _ops(result.graph_module if result is not None else graph_module)
                changed[name] = changed.get(name, False) or after != before
        return result

    pass_base.PassBase.__call__ = timed
    model = build_model(ModelConfig(alpha=args.alpha, input_size=args.input_size), seed=0)
    phases: dict[str, float] = {}
    start = time.perf_counter()
    lower_training_program(training_step(model, "fast"), args.input_size, 64, phases=phases,
                           shortcuts=not args.no_shortcuts)  # fmt: skip
    total = time.perf_counter() - start
    rows = [{"pass": name, "seconds": round(s, 2), "calls": calls[name], "changes_ops": changed.get(name)}
            for name, s in seconds.most_common()]  # fmt: skip
    print(f"export {total:.0f} s; phases " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()))
    for row in rows:
        what = {True: "changes ops", False: "changes no op", None: "per partition"}[row["changes_ops"]]
        print(f"{row['seconds']:7.2f} s {row['calls']:4d}x {row['pass']} ({what})")
    name = "export_passes" + ("_no_shortcuts" if args.no_shortcuts else "")
    payload = {"alpha": args.alpha, "input_size": args.input_size, "export_s": total, "phases_s": phases}
    print("wrote", write_results(name, {**payload, "passes": rows}))


if __name__ == "__main__":
    main()
