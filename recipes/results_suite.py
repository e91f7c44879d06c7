"""``make results``: every experiment of docs/RESULTS.md on 3 seeds, and the tables it prints.

Each experiment is one ``fedper simulate`` command per seed, run as a subprocess (two at a
time, one torch thread each); a run whose ``results.json`` exists with the same command is
reused, so an interrupted suite resumes. The tables give, over seeds, the mean +- std of
the clients' mean final accuracy (after the last aggregation) and of the last-5 mean, and
per-client paired differences against the other algorithms pooled over seeds (mean +- SE),
and the baselines on the same splits. The tables replace the block between the markers in
docs/RESULTS.md (``--write``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedper._recipes import bn_modes, pretrain_probe
from fedper._recipes.doc_block import write_block
from fedper._recipes.suite_options import suite_parser
from fedper.common.atomic_write import atomic_write_text
from fedper.common.errors import FedperError
from fedper.pretrained import PACKAGED_BASE
from fedper.run_results import RESULTS_FILE, AlgorithmSummary, RunResults, load_results

SEEDS = (0, 1, 2)
BEGIN, END = "<!-- results:begin (make results) -->", "<!-- results:end -->"
SYNTH = ("--dataset", "aesthetic-synth")
DIGITS = ("--dataset", "digits", "--local-epochs", "2", "--rounds", "20")
# The aggregation these tables were made with: the mean with the norm bound and the weight cap,
# without the coordinate clip the default gained later (its cost on honest runs: docs/SERVER.md).
NO_COORDINATE_CLIP = ("--coordinate-clip", "0")


@dataclass(frozen=True)
class Experiment:
    """One row group of the tables: a name, its ``fedper simulate`` options and its table."""

    name: str
    table: str
    options: tuple[str, ...]
    reference: str = ""  # an experiment on the same splits whose FedPer this one is paired with


SWEEP = "aesthetic-synth: kp sweep, linear base and the base's start"
CHOICE = "aesthetic-synth: choosing the head on a validation split of the training photos"
ALL3 = ("--algorithms", "fedper,fedavg,local", *NO_COORDINATE_CLIP)
FEDPER = ("--algorithms", "fedper", *NO_COORDINATE_CLIP)
# digits: local dropped to keep make results near an hour
FEDPER_FEDAVG = ("--algorithms", "fedper,fedavg", *NO_COORDINATE_CLIP)
VALIDATE = (*SYNTH, *FEDPER, "--validate")
EXPERIMENTS: tuple[Experiment, ...] = (
    # aesthetic-synth's preset: the packaged pretrained base, the ordinal head, kp=1.
    Experiment("synth", "aesthetic-synth", (*SYNTH, *ALL3, "--holdout-clients", "5")),
    Experiment("synth-scratch", SWEEP, (*SYNTH, *FEDPER, "--init", "scratch"), reference="synth"),
    Experiment("synth-kp2", SWEEP, (*SYNTH, *FEDPER, "--kp", "2"), reference="synth"),
    Experiment("synth-kp3", SWEEP, (*SYNTH, *FEDPER, "--kp", "3"), reference="synth"),
    Experiment("synth-kp4", SWEEP, (*SYNTH, *FEDPER, "--kp", "4"), reference="synth"),
    # A linear base has no layer a checkpoint could start: it starts from random weights.
    Experiment("synth-linear", SWEEP, (*SYNTH, *FEDPER, "--base", "linear", "--init", "scratch"), reference="synth"),
    Experiment("synth-val-ordinal", CHOICE, (*VALIDATE, "--head", "ordinal")),
    Experiment("synth-val-softmax", CHOICE, (*VALIDATE, "--head", "softmax"), reference="synth-val-ordinal"),
    Experiment("digits-k4", "digits", (*DIGITS, "--classes-per-client", "4", *FEDPER_FEDAVG, "--kp", "2")),
    Experiment("digits-k10", "digits", (*DIGITS, "--classes-per-client", "10", *FEDPER_FEDAVG, "--kp", "2")),
)


def _command(fedper: str, experiment: Experiment, seed: int, out: Path) -> list[str]:
    return [fedper, "simulate", *experiment.options, "--seed", str(seed), "--threads", "1", "--out", str(out)]


def run_one(fedper: str, experiment: Experiment, seed: int, root: Path) -> Path:
    out = root / f"{experiment.name}-seed{seed}"
    command = _command(fedper, experiment, seed, out)
    stamp = out / "command.json"
    if (out / RESULTS_FILE).exists() and stamp.exists() and json.loads(stamp.read_text()) == command[1:]:
        return out
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (root / f"{out.name}.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise FedperError(f"{' '.join(command)} failed ({done.returncode}); see {root / out.name}.log")
    atomic_write_text(stamp, json.dumps(command[1:]) + "\n")
    print(f"  {out.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return out


def run_all(
    fedper: str, root: Path, seeds: Sequence[int], jobs: int, experiments: Sequence[Experiment] = EXPERIMENTS
) -> dict[str, list[Path]]:
    """Every experiment on every seed (longest first); experiment name -> run dirs, seed order."""
    root.mkdir(parents=True, exist_ok=True)
    work = [(e, s) for e in experiments for s in seeds]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        dirs = list(pool.map(lambda es: run_one(fedper, es[0], es[1], root), work))
    out: dict[str, list[Path]] = {}
    for (experiment, _), d in zip(work, dirs, strict=True):
        out.setdefault(experiment.name, []).append(d)
    return out


def mean_std(values: Sequence[float | None]) -> str:
    """Mean ± population std over runs; "-" if a run lacks the number (a file written before it existed)."""
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return "-"
    return f"{np.mean(known):.3f} ± {np.std(known):.3f}"


def summary_of(run: RunResults, algorithm: str) -> AlgorithmSummary:
    """A run's algorithm, or a clear error: a table must not leave a run out silently."""
    if algorithm not in run.algorithms:
        raise FedperError(f"a run of the suite has no {algorithm!r} results (it has {', '.join(run.algorithms)})")
    return run.algorithms[algorithm]


def paired_difference(runs: list[RunResults], a: str, b: str, against: list[RunResults] | None = None) -> str:
    """Per-client final differences a - b pooled over seeds: mean ± standard error (n pairs); b
    from ``against`` (runs of another experiment on the same splits, same seed order) if given."""
    diffs = []
    for r, other in zip(runs, against or runs, strict=True):
        pa, pb = summary_of(r, a).final_per_client, summary_of(other, b).final_per_client
        diffs += [pa[c] - pb[c] for c in pa if c in pb]
    if len(diffs) < 2:
        return "-"
    se = float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    wins = sum(d > 0 for d in diffs)
    losses = sum(d < 0 for d in diffs)
    return f"{np.mean(diffs):+.3f} ± {se:.3f} ({wins} won / {losses} lost of {len(diffs)})"


def tables(runs_by_name: dict[str, list[Path]], experiments: Sequence[Experiment] = EXPERIMENTS) -> str:
    """The markdown tables: one per experiments' table, rows per experiment and algorithm."""
    lines: list[str] = []
    for table in dict.fromkeys(e.table for e in experiments):
        lines += [f"**{table}** (seeds {', '.join(map(str, SEEDS))})", ""]
        lines += [
            "| run | algorithm | kp | base | head | initial base | final mean acc (mean ± std over seeds) | "
            "last-5 mean | client std | paired difference per client (mean ± SE) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        baselines: dict[str, list[float | None]] = {}
        for experiment in (e for e in experiments if e.table == table):
            runs = [load_results(d) for d in runs_by_name[experiment.name]]
            sim = runs[0].config.get("simulation")
            if not isinstance(sim, dict):
                raise FedperError(f"{runs_by_name[experiment.name][0]}/results.json is not a simulation's run")
            algorithms = list(runs[0].algorithms)
            for algorithm in algorithms:
                finals = [summary_of(r, algorithm) for r in runs]
                head_modules = sim.get("head_modules")
                personal = (
                    f"head {', '.join(map(str, head_modules))}"
                    if isinstance(head_modules, list) and head_modules
                    else sim["kp"]
                )
                kp = {"fedper": personal, "fedavg": 0}.get(algorithm, "-")
                others = [o for o in algorithms if o != algorithm] if algorithm == "fedper" else []
                paired = "; ".join(f"vs {o}: {paired_difference(runs, algorithm, o)}" for o in others)
                if experiment.reference and algorithm == "fedper":
                    reference = [load_results(d) for d in runs_by_name[experiment.reference]]
                    difference = paired_difference(runs, algorithm, algorithm, reference)
                    paired = f"vs {experiment.reference}'s fedper: {difference}"
                paired = paired or "-"
                lines.append(
                    f"| {experiment.name} | {algorithm} | {kp} | {sim['base']} | {sim.get('head', 'softmax')} | "
                    f"{sim.get('init') or 'scratch'} | "
                    f"{mean_std([f.final_mean_accuracy for f in finals])} | "
                    f"{mean_std([f.last5_mean_accuracy for f in finals])} | "
                    f"{np.mean([f.final_std for f in finals]):.3f} | {paired} |"
                )
            if not baselines:  # the same splits in every experiment of a table: the first one's
                for name in runs[0].baselines:
                    baselines[name] = [r.baselines[name].mean_accuracy if name in r.baselines else None for r in runs]
        for name, values in baselines.items():
            lines.append(f"| same splits | baseline: {name} | - | - | - | - | {mean_std(values)} | - | - | - |")
        lines.append("")
    return "\n".join(lines)


def _mean_se(values: list[float], spec: str = ".3f") -> str:
    """Mean ± standard error; one value has no spread, none is "-"."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{format(values[0], spec)} (one user)"
    se = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return f"{format(float(np.mean(values)), spec)} ± {se:.3f}"


def new_users_table(runs: list[Path]) -> str:
    """New users' accuracy against N per variant, users of every seed pooled: mean ± SE (users);
    and FedPer's base with a fresh head against the majority of the user's N ratings, paired."""
    found = [n for n in (load_results(d).new_users for d in runs) if n is not None]
    if not found:
        return ""
    variants = list(found[0].curves)
    paired = ("fedper: head", "majority of N")
    lines = [
        f"**new users** (`--holdout-clients`, {len(found[0].users)} per seed, seeds pooled; "
        f"{found[0].steps} SGD steps at every N)",
        "",
        "| N photos | users | " + " | ".join(variants) + " | fedper: head − majority of N (paired) |",
        "|---|---|" + "---|" * (len(variants) + 1),
    ]

    def per_user(variant: str, n: int) -> list[tuple[int, str, float]]:
        points = [(k, nu.curves.get(variant, {}).get(str(n))) for k, nu in enumerate(found)]
        return [(k, u, v) for k, p in points if p is not None for u, v in p.per_user.items()]

    for n in found[0].sizes:
        cells, users = [], 0
        for variant in variants:
            values = [v for _, _, v in per_user(variant, n)]
            users = max(users, len(values))
            cells.append(_mean_se(values))
        if all(p in variants for p in paired):
            other = {(k, u): v for k, u, v in per_user(paired[1], n)}
            diffs = np.array([v - other[(k, u)] for k, u, v in per_user(paired[0], n) if (k, u) in other])
            won, lost = int((diffs > 0).sum()), int((diffs < 0).sum())
            cells.append(f"{_mean_se(list(diffs), '+.3f')} ({won} won / {lost} lost)" if len(diffs) else "-")
        else:
            cells.append("-")
        lines.append(f"| {n} | {users} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# Bases that are not packaged, each made by its fedper pretrain command (its other options the
# packaged base's): the naive pretext for the comparison of targets, and the 64 px base.
EDITS_PRETRAIN = ("pretrain", "--targets", "edits", "--threads", "1")
PRETRAIN_64 = ("pretrain", "--input-size", "64", "--threads", "1")


def pretrained_base(fedper: str, root: Path, name: str, command: Sequence[str]) -> Path:
    """``root/<name>/base.safetensors``, made by ``fedper <command>`` unless it is there."""
    out = root / name
    if not (out / "base.safetensors").exists():
        start = time.perf_counter()
        with (root / f"{name}.log").open("w") as log:
            done = subprocess.run([fedper, *command, "--out", str(out)], stdout=log, stderr=subprocess.STDOUT,
                                  check=False)  # fmt: skip
        if done.returncode != 0:
            raise FedperError(f"fedper {' '.join(command)} failed; see {root / f'{name}.log'}")
        print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return out / "base.safetensors"


def probes(
    root: Path, seeds: Sequence[int], base: Path = PACKAGED_BASE, name: str = "probe", size: int = 32
) -> list[dict[str, Any]]:
    """The frozen-base probe of ``base`` at ``size`` px (recipes.pretrain_probe) per seed, reused
    from ``root/<name>-seed<S>.json`` when there."""
    out = []
    for seed in seeds:
        path = root / f"{name}-seed{seed}.json"
        if not path.exists():
            start = time.perf_counter()
            atomic_write_text(path, json.dumps(pretrain_probe.probe_seed(base, size, seed)) + "\n")
            print(f"  {path.stem}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        out.append(json.loads(path.read_text()))
    return out


def _pooled(results: list[dict[str, Any]], a: str, b: str) -> str:
    diffs = np.concatenate([np.array(r[a]) - np.array(r[b]) for r in results])
    se = float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    won, lost = int((diffs > 0).sum()), int((diffs < 0).sum())
    return f"{np.mean(diffs):+.3f} ± {se:.3f} ({won} won / {lost} lost of {len(diffs)})"


def targets_table(looks: list[dict[str, Any]], edits: list[dict[str, Any]]) -> str:
    """The two pretexts' bases under the same per-user probes, paired user by user."""
    lines = [
        "**which targets** (frozen-base probes as above; `all`: the packaged base, `edits`: `fedper "
        f"{' '.join(EDITS_PRETRAIN)}`)",
        "",
        "| per-user probe | targets: edits + category | targets: all (looks + edits + category) | "
        "all − edits (paired) |",
        "|---|---|---|---|",
    ]
    for label, key in (("logistic", "pretrained"), ("ordinal", "pretrained_ordinal")):
        joined = [{"a": a[key], "e": e[key]} for a, e in zip(looks, edits, strict=True)]
        a, e = np.mean([np.mean(r[key]) for r in looks]), np.mean([np.mean(r[key]) for r in edits])
        lines.append(f"| {label} | {e:.3f} | {a:.3f} | {_pooled(joined, 'a', 'e')} |")
    return "\n".join(lines) + "\n"


def probe_tables(results: list[dict[str, Any]], which: str = "the packaged base") -> str:
    """Per-user probes (pooled over seeds' users, paired) and what each generator feature's R² is."""
    seeds = ", ".join(str(r["seed"]) for r in results)

    def mean(key: str) -> str:
        return f"{np.mean([np.mean(r[key]) for r in results]):.3f}"

    lines = [
        f"**frozen-base probe, {results[0]['size']} px** ({which}; {len(results[0]['random'])} users per seed, "
        f"seeds {seeds})",
        "",
        "| per-user probe | majority | random base | pretrained base | pretrained − random (paired) | "
        "pretrained − majority (paired) | generator features (ceiling) |",
        "|---|---|---|---|---|---|---|",
        f"| logistic | {mean('majority')} | {mean('random')} | {mean('pretrained')} | "
        f"{_pooled(results, 'pretrained', 'random')} | {_pooled(results, 'pretrained', 'majority')} | "
        f"{mean('generator_features')} |",
        f"| ordinal | {mean('majority')} | {mean('random_ordinal')} | {mean('pretrained_ordinal')} | "
        f"{_pooled(results, 'pretrained_ordinal', 'random_ordinal')} | "
        f"{_pooled(results, 'pretrained_ordinal', 'majority')} | {mean('generator_features_ordinal')} |",
        "",
        "| generator feature | R², pretrained base | R², random base |",
        "|---|---|---|",
    ]
    for feature in results[0]["random_feature_r2"]:
        pre = np.mean([r["pretrained_feature_r2"][feature] for r in results])
        rnd = np.mean([r["random_feature_r2"][feature] for r in results])
        lines.append(f"| {feature} | {pre:.2f} | {rnd:.2f} |")
    return "\n".join(lines) + "\n"


def sizes_table(at32: list[dict[str, Any]], at64: list[dict[str, Any]]) -> str:
    """The 64 px base against the packaged 32 px one, each probed at its own size, user by user
    (the same users and splits: only the rendering size differs)."""
    lines = [
        f"**32 against 64 px** (frozen-base probes as above; 64 px: `fedper {' '.join(PRETRAIN_64)}`, probed on the "
        "same users' photos rendered at 64 px)",
        "",
        "| per-user probe | majority | pretrained, 32 px | pretrained, 64 px | 64 − 32 px (paired) | "
        "64 px − majority (paired) |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (("logistic", "pretrained"), ("ordinal", "pretrained_ordinal")):
        joined = [{"b": b[key], "a": a[key], "m": b["majority"]} for a, b in zip(at32, at64, strict=True)]
        a, b = np.mean([np.mean(r[key]) for r in at32]), np.mean([np.mean(r[key]) for r in at64])
        m = np.mean([np.mean(r["majority"]) for r in at64])
        lines.append(f"| {label} | {m:.3f} | {a:.3f} | {b:.3f} | {_pooled(joined, 'b', 'a')} | "
                     f"{_pooled(joined, 'b', 'm')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def copy_plots(runs_by_name: dict[str, list[Path]], img: Path) -> None:
    """Seed 0's plots of the main experiments, as docs/img/<experiment>_<plot>.png."""
    img.mkdir(parents=True, exist_ok=True)
    for name in ("synth", "digits-k4", "digits-k10"):
        for plot in ("accuracy_per_round.png", "new_users.png"):
            src = runs_by_name[name][0] / plot
            if src.exists():
                shutil.copyfile(src, img / f"{name.replace('-', '_')}_{plot}")


def write_into(doc: Path, text: str) -> None:
    """Replace the block between BEGIN and END in ``doc`` with ``text``."""
    write_block(doc, BEGIN, END, text)


def main(argv: Sequence[str] | None = None) -> int:
    p = suite_parser("results_suite", __doc__, Path("runs/results"), "tables")
    args = p.parse_args(argv)
    start = time.perf_counter()
    runs = run_all(args.fedper, args.out, SEEDS, args.jobs)
    text = tables(runs) + "\n" + new_users_table(runs["synth"])
    text += "\n**BatchNorm statistics at evaluation** (synth, final models, mean ± std over seeds)\n\n"
    text += bn_modes.table(runs["synth"]) + "\n\n"
    looks = probes(args.out, SEEDS)
    edits = probes(args.out, SEEDS, pretrained_base(args.fedper, args.out, "pretrain-edits", EDITS_PRETRAIN),
                   "probe-edits")  # fmt: skip
    at64 = probes(args.out, SEEDS, pretrained_base(args.fedper, args.out, "pretrain-64", PRETRAIN_64), "probe-64", 64)
    text += probe_tables(looks) + "\n" + targets_table(looks, edits) + "\n"
    text += probe_tables(at64, f"`fedper {' '.join(PRETRAIN_64)}`") + "\n" + sizes_table(looks, at64)
    atomic_write_text(args.out / "tables.md", text + "\n")
    print(text)
    if args.write is not None:
        write_into(args.write, text)
        copy_plots(runs, args.write.parent / "img")
    print(f"{len(EXPERIMENTS) * len(SEEDS)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
