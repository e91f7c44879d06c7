"""The ARM check's measurements (arm_check.sh; docs/DEVICES.md, "An ARM device on this machine").

``first_step.py step ARTIFACTS OUT.npz [--perturb]``: the Python device's first training step
(``TrainingProgram``, as ``fedper device`` trains) from the export's initial weights on a seeded
batch of 16; its loss and gradients go to OUT.npz. ``--perturb`` moves every input by one ulp
(x * (1 + 2^-23)): how far x86-64 itself moves under a change that small is the yardstick.

``first_step.py compare X86.npz X86_ULP.npz ARM.npz``: the aarch64 step against the x86-64 one.
Each gradient's error is ||arm - x86|| / ||x86||; the aarch64 run passes when its loss is as close
to x86's as twice x86's own one-ulp run (or 4 float32 ulps), and its median and largest gradient
errors are within twice x86's own under one ulp (training a whole model from random weights is
ill-conditioned: docs/TESTING.md; trajectories are not compared, first steps are).

``first_step.py rounds URL SERVER_LOG N``: the server closed N rounds, each with the device's
accepted update.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

BATCH, SEED, LR, MOMENTUM = 16, 1234, 0.01, 0.9


def step(artifacts: Path, out: Path, perturb: bool) -> None:
    started = time.perf_counter()
    import torch

    from fedper.device_runtime.training_program import TrainingProgram

    program = TrainingProgram(artifacts)
    manifest = program.manifest
    rng = np.random.default_rng(SEED)
    size = manifest.model.input_size
    x = rng.standard_normal((BATCH, 3, size, size), dtype=np.float32)
    y = rng.integers(0, manifest.output.num_classes, size=BATCH, dtype=np.int64)
    if perturb:
        x = (x * np.float32(1 + 2**-23)).astype(np.float32)
    program.start_round(LR, MOMENTUM)
    loaded = time.perf_counter()
    loss = program.train_step(torch.from_numpy(x), torch.from_numpy(y))
    stepped = time.perf_counter()
    grads = {f"grad.{n}": g.numpy() for n, g in program.last_gradients().items()}
    grads["loss"] = np.array(loss, dtype=np.float32)
    np.savez(out, **grads)  # type: ignore[arg-type]  # the stub reads any key as allow_pickle: bool
    print(f"{platform.machine()}: loss {loss:.9g}, load {loaded - started:.1f} s, step {stepped - loaded:.2f} s")


def _errors(a: np.lib.npyio.NpzFile, b: np.lib.npyio.NpzFile) -> dict[str, float]:
    out = {}
    for name in a.files:
        if name.startswith("grad."):
            ref = a[name].astype(np.float64)
            norm = float(np.linalg.norm(ref))
            out[name[5:]] = float(np.linalg.norm(b[name].astype(np.float64) - ref)) / max(norm, 1e-30)
    return out


def compare(x86_path: Path, ulp_path: Path, arm_path: Path) -> int:
    x86, ulp, arm = np.load(x86_path), np.load(ulp_path), np.load(arm_path)
    loss = float(x86["loss"])
    loss_arm, loss_ulp = abs(float(arm["loss"]) - loss), abs(float(ulp["loss"]) - loss)
    loss_bound = max(2 * loss_ulp, 4 * float(np.spacing(np.float32(loss))))
    arm_errors, ulp_errors = _errors(x86, arm), _errors(x86, ulp)
    worst = sorted(arm_errors, key=arm_errors.__getitem__, reverse=True)[:5]
    a_med, a_max = float(np.median(list(arm_errors.values()))), max(arm_errors.values())
    u_med, u_max = float(np.median(list(ulp_errors.values()))), max(ulp_errors.values())
    print(
        f"first step, x86-64 vs aarch64: loss {loss:.9g} vs {float(arm['loss']):.9g}: |difference| {loss_arm:.3g} "
        f"(x86 vs itself one ulp of input away: {loss_ulp:.3g}; bound {loss_bound:.3g})"
    )
    print(
        f"gradients ({len(arm_errors)} tensors), ||arm - x86|| / ||x86||: median {a_med:.3g}, largest {a_max:.3g}; "
        f"x86 one ulp away: median {u_med:.3g}, largest {u_max:.3g}; bounds {2 * u_med:.3g} and {2 * u_max:.3g}"
    )
    for name in worst:
        print(f"  {name}: {arm_errors[name]:.3g} (x86 one ulp away: {ulp_errors[name]:.3g})")
    failed = loss_arm > loss_bound or a_med > 2 * u_med or a_max > 2 * u_max
    print("first step: " + ("OUT OF BOUNDS" if failed else "within the bounds"))
    return 1 if failed else 0


def rounds(url: str, server_log: Path, expected: int) -> int:
    import httpx

    from fedper.common.protocol import Route

    status = httpx.get(f"{url}{Route.STATUS}").json()
    events = [json.loads(line) for line in server_log.read_text().splitlines() if line.startswith("{")]
    accepted = [e for e in events if e.get("event") == "update_accepted"]
    closed = [e for e in events if e.get("event") == "round_closed"]
    for e in closed:
        print(f"round {e['round']}: closed ({e['reason']}), {e['updates']} update(s), "
              f"model version {e['model_version']}")  # fmt: skip
    ok = status["rounds_closed"] == expected and len(accepted) == expected and all(e["updates"] == 1 for e in closed)
    print(
        f"server: {status['rounds_closed']} rounds closed, {len(accepted)} aarch64 updates accepted"
        + ("" if ok else f"; expected {expected} of each")
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("step")
    s.add_argument("artifacts", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--perturb", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("x86", type=Path)
    c.add_argument("ulp", type=Path)
    c.add_argument("arm", type=Path)
    r = sub.add_parser("rounds")
    r.add_argument("url")
    r.add_argument("server_log", type=Path)
    r.add_argument("expected", type=int)
    a = parser.parse_args()
    if a.command == "step":
        step(a.artifacts, a.out, a.perturb)
        return 0
    if a.command == "compare":
        return compare(a.x86, a.ulp, a.arm)
    return rounds(a.url, a.server_log, a.expected)


if __name__ == "__main__":
    sys.exit(main())
