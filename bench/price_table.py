"""The price of the export's choices (docs/EXPORT.md: one XNNPACK delegate per run of consecutive
ops, shortcuts in the delegation, more ops in XNNPACK): export time, planned memory and step time
at 1 and 2 threads, for each model size, before and after, measured in one run on one machine;
and the targets.

"Before" is the training program of another commit (default ``39bb1a0``, an export without them),
exported by that commit's own code in a git worktree; "after" is this tree's. Per model size (width
0.25 and 1.0, 32 and 224 px), each in a fresh process:

- the export of the training program at ``max_batch`` 32 (cold: no cache), timed;
- its planned memory (``export.program_memory.planned_memory``, what ``MethodMeta`` reports) beside
  the step's lower bound at batch 32 (``bench.train_memory``'s);
- the step at 1 and 2 threads on both programs and in eager PyTorch (``bench.train_step``'s children),
  ``--repeats`` times interleaved, the median; batch 32 at 32 px and 8 at 224 px (a step of width
  1.0 at 224 px and batch 32 takes seconds; the targets are at 32 px).

The other commit's export runs as a snippet (:data:`_EXPORT`) in its worktree, because its ``bench``
package has no module to call: it uses only what both trees define (``build_model``,
``training_step``, ``lower_training_program``). The demo's time (the fourth target) is ``make demo``'s.

Usage: python -m bench.price_table [--before 39bb1a0] [--sizes 0.25/32/32,...] [--repeats 3]
       [--name price_table]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import run_child, write_results

SIZES = "0.25/32/32,1.0/32/32,0.25/224/8,1.0/224/8"
EXPORT_BATCH = 32
REPO = Path(__file__).resolve().parent.parent
MIB = 2**20

# Run with the exporting tree as the working directory (first on ``sys.path``): the API both trees share.
_EXPORT = """
import json, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from fedper.export.executorch_lowering import lower_training_program
from fedper.export.training_graph import training_step
from fedper.models import ModelConfig, build_model
alpha, size, batch, out = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0)
step = training_step(model, "fast")
start = time.perf_counter()
lowered = lower_training_program(step, size, batch)
seconds = time.perf_counter() - start
(out / "train.pte").write_bytes(lowered.program)
(out / "train.ptd").write_bytes(lowered.weights)
state = model.state_dict()
(out / "stats.json").write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
print(json.dumps({"export_s": seconds}))
"""

# The targets: (what, where, test).
TARGET_EXPORT_S = {(0.25, 32): 45.0, (1.0, 224): 180.0}
TARGET_MEMORY_RATIO = 2.0
TARGET_STEP_RATIO = 1.0
TARGET_THREAD_SPEEDUP = 1.5
STEP_TARGET_SIZES = {(0.25, 32), (1.0, 32)}


def export_in(tree: Path, alpha: float, size: int, out: Path) -> dict[str, Any]:
    """Export the training program with ``tree``'s code, in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", _EXPORT, str(alpha), str(size), str(EXPORT_BATCH), str(out)],
        cwd=tree, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"export in {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def planned_child(pte: str) -> dict[str, float]:
    from fedper.export.program_memory import planned_memory

    memory = planned_memory(Path(pte).read_bytes())
    return {"planned_mib": memory.total / MIB, "liveness_peak_mib": memory.liveness_peak / MIB}


def worktree(rev: str, into: Path) -> Path:
    """A detached checkout of ``rev`` (the repository's own history) to export with."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), rev], check=True,
                   capture_output=True)  # fmt: skip
    return into


def measure(trees: dict[str, Path], alpha: float, size: int, batch: int, steps: int, repeats: int,
            workdir: Path) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"alpha": alpha, "input_size": size, "export_batch": EXPORT_BATCH, "step_batch": batch}
    row.update(run_child("bench.train_memory", "bound", str(alpha), str(size), str(EXPORT_BATCH)))
    programs: dict[str, Path] = {}
    for name, tree in trees.items():
        out = workdir / name
        out.mkdir()
        row[name] = export_in(tree, alpha, size, out)
        row[name].update(run_child("bench.price_table", "planned", str(out / "train.pte")))
        row[name]["planned_over_bound"] = row[name]["planned_mib"] / row["lower_bound_mib"]
        programs[name] = out
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):  # interleaved, so that a slow spell of the machine hits all alike
        for threads in (1, 2):
            for name, out in programs.items():
                ms = run_child("bench.train_step", "et", str(out / "train.pte"), str(out / "train.ptd"),
                               str(out / "stats.json"), str(size), str(batch), str(steps), str(threads))["ms"]  # fmt: skip
                runs.setdefault(f"{name}_{threads}", []).append(ms)
            eager = ("eager", str(alpha), str(size), str(batch), str(threads), str(steps))
            ms = run_child("bench.train_step", *eager)["ms"]
            runs.setdefault(f"eager_{threads}", []).append(ms)
    for key, times in runs.items():
        name, count = key.rsplit("_", 1)
        row.setdefault(name, {})[f"step_ms_{count}thread"] = statistics.median(times)
        row[name][f"step_runs_ms_{count}thread"] = times
    for name in programs:
        for threads in (1, 2):
            row[name][f"over_eager_{threads}thread"] = (
                row[name][f"step_ms_{threads}thread"] / row["eager"][f"step_ms_{threads}thread"]
            )
        row[name]["speedup_2_over_1"] = row[name]["step_ms_1thread"] / row[name]["step_ms_2thread"]
    return row


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target (but the demo's) against the "after" program of the same run."""
    checks: list[dict[str, Any]] = []
    for row in rows:
        key, after = (row["alpha"], row["input_size"]), row["after"]
        where = f"width {row['alpha']}, {row['input_size']} px"
        if key in TARGET_EXPORT_S:
            checks.append({"target": f"export {where} <= {TARGET_EXPORT_S[key]:.0f} s", "value": after["export_s"],
                           "met": after["export_s"] <= TARGET_EXPORT_S[key]})  # fmt: skip
        checks.append({"target": f"planned memory {where}, batch {EXPORT_BATCH} <= {TARGET_MEMORY_RATIO}x the bound",
                       "value": after["planned_over_bound"],
                       "met": after["planned_over_bound"] <= TARGET_MEMORY_RATIO})  # fmt: skip
        if key in STEP_TARGET_SIZES:
            checks.append({"target": f"step {where} <= {TARGET_STEP_RATIO}x eager at 1 thread",
                           "value": after["over_eager_1thread"],
                           "met": after["over_eager_1thread"] <= TARGET_STEP_RATIO})  # fmt: skip
            checks.append({"target": f"step {where}: 2 threads >= {TARGET_THREAD_SPEEDUP}x faster than 1",
                           "value": after["speedup_2_over_1"],
                           "met": after["speedup_2_over_1"] >= TARGET_THREAD_SPEEDUP})  # fmt: skip
    return checks


def table(rows: list[dict[str, Any]]) -> str:
    """The price table in Markdown, as docs/PERFORMANCE.md shows it."""
    lines = ["| model | program | export | planned (bound) | step 1 thread (x eager) | step 2 threads (x eager) "
             "| 2 threads vs 1 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        model = f"width {row['alpha']}, {row['input_size']} px (step batch {row['step_batch']})"
        for name in ("before", "after"):
            p = row[name]
            lines.append(
                f"| {model} | {name} | {p['export_s']:.0f} s | {p['planned_mib']:.0f} MiB ({row['lower_bound_mib']:.0f}) "
                f"| {p['step_ms_1thread']:.0f} ms ({p['over_eager_1thread']:.2f}x) "
                f"| {p['step_ms_2thread']:.0f} ms ({p['over_eager_2thread']:.2f}x) | {p['speedup_2_over_1']:.2f}x |"
            )
        e = row["eager"]
        lines.append(f"| {model} | eager | | | {e['step_ms_1thread']:.0f} ms | {e['step_ms_2thread']:.0f} ms "
                     f"| {e['step_ms_1thread'] / e['step_ms_2thread']:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", default="39bb1a0", help="the commit whose program is 'before'")
    parser.add_argument("--sizes", default=SIZES, help="alpha/input/step batch,...")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement (median reported)")
    parser.add_argument("--name", default="price_table", help="results file name (bench/results/NAME.json)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(planned_child(args.child[1])))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        before = worktree(args.before, Path(tmp) / "before")
        try:
            for spec in args.sizes.split(","):
                alpha, size, batch = spec.split("/")
                workdir = Path(tmp) / spec.replace("/", "_")
                workdir.mkdir()
                trees = {"before": before, "after": REPO}
                row = measure(trees, float(alpha), int(size), int(batch), args.steps, args.repeats, workdir)
                rows.append(row)
                print("\n".join(table([row]).splitlines()[-3:]), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    checks = targets(rows)
    print(table(rows))
    for check in checks:
        print(f"{'met' if check['met'] else 'NOT met'}: {check['target']} ({check['value']:.2f})")
    print("wrote", write_results(args.name, {"before": args.before, "rows": rows, "targets": checks}))


if __name__ == "__main__":
    main()
