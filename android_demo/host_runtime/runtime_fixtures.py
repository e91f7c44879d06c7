"""Python's side of the real-runtime host tests (run by host-test.sh, not by pytest).

``runtime_fixtures.py program OUT``: the demo's model exported for real (``fedper export``:
MobileNet-V1 0.25 at 32 px, kp 2, seed 0) into ``OUT/program``, and the same export with
``training.trainable = "head"`` in ``OUT/program-head``.

``runtime_fixtures.py train CASE``: the Python device (``fedper.device_runtime``'s
``TrainingProgram``, what ``fedper device`` trains with) runs a case the Java test wrote, and
writes what it got beside it. A case directory holds ``case.json`` (``export``: the export
directory; ``learning_rate``, ``momentum``; ``steps``: a list of ``[batch size]``),
``weights.safetensors`` (the base and head to start from; with ``clip_norm``, what a DP or
secure round's device sends is written too, as ``clipped.NAME``), ``batches.bin`` (each step's pixels as
little-endian float32 NCHW, then its labels as little-endian int64). Python writes
``python.json`` (each step's loss, as float32 bits; with ``clip_norm``, ``unclipped``) and
``python.safetensors``: the base and head after the last step, and the first step's gradients
named ``grad.NAME``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np


def program(out: Path) -> None:
    from fedper.common.manifest import read_manifest, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    target = out / "program"
    subprocess.run([sys.executable, "-m", "fedper.cli", "export", "--model", "mobilenet_v1", "--alpha", "0.25",
                    "--input-size", "32", "--num-classes", "10", "--kp", "2", "--seed", "0", "--out", str(target)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    head = out / "program-head"
    shutil.rmtree(head, ignore_errors=True)
    shutil.copytree(target, head)
    manifest = read_manifest(head)
    training = dataclasses.replace(manifest.training, trainable="head")
    write_manifest(head, manifest.model_copy(update={"training": training}))


def train(case: Path) -> None:
    import torch
    from safetensors.numpy import load_file, save_file

    from fedper.device_runtime.training_program import TrainingProgram

    spec = json.loads((case / "case.json").read_text())
    directory = Path(spec["export"])
    trainer = TrainingProgram(directory)
    manifest = trainer.manifest
    weights = load_file(str(case / "weights.safetensors"))
    trainer.set_base({n: weights[n] for n in manifest.base_names})
    trainer.set_head({n: weights[n] for n in manifest.head_names})
    trainer.start_round(spec["learning_rate"], spec["momentum"])
    raw = (case / "batches.bin").read_bytes()
    size = manifest.model.input_size
    at, losses = 0, []
    out: dict[str, np.ndarray] = {}
    for k, (n,) in enumerate(spec["steps"]):
        pixels = np.frombuffer(raw, "<f4", n * 3 * size * size, at).reshape(n, 3, size, size)
        at += pixels.nbytes
        labels = np.frombuffer(raw, "<i8", n, at)
        at += labels.nbytes
        loss = trainer.train_step(torch.from_numpy(pixels.copy()), torch.from_numpy(labels.copy()))
        losses.append(int(np.float32(loss).view(np.uint32)))
        if k == 0:
            out.update({f"grad.{n}": g.numpy() for n, g in trainer.last_gradients().items()})
    if at != len(raw):
        raise SystemExit(f"{case}/batches.bin: {len(raw) - at} bytes left over after {len(spec['steps'])} steps")
    result: dict[str, object] = {"loss_bits": losses}
    trained = {n: t.numpy() for n, t in {**trainer.get_base(), **trainer.get_head()}.items()}
    out.update(trained)
    if "clip_norm" in spec:  # what a DP or secure round's device sends: the base delta clipped
        from fedper.common.dp.clipping import clip_delta

        clipped = clip_delta(trained, weights, manifest.base_names, spec["clip_norm"])
        out.update({f"clipped.{n}": np.asarray(t, np.float32) for n, t in clipped.tensors.items()})
        result["unclipped"] = clipped.unclipped
    save_file(out, str(case / "python.safetensors"))
    (case / "python.json").write_text(json.dumps(result))


if __name__ == "__main__":
    command, target = sys.argv[1], Path(sys.argv[2])
    {"program": program, "train": train}[command](target)
