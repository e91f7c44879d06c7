"""Python's side of the Android core's host tests (run by host-test.sh, not by pytest).

``host_fixtures.py make OUT``: server-only exports (real manifest and weights, placeholder
programs) and a safetensors file written by Python's ``safetensors``. ``artifacts`` is the main
export (kp 2, seed 0); ``artifacts-head`` the same with ``training.trainable = "head"``;
``artifacts-seed1`` another model with the same partition; ``artifacts-kp1`` a partition whose
base holds tensors that ``artifacts`` keeps personal.
``host_fixtures.py verify FILE``: checks a file the Java codec wrote; exit 1 with the difference.
``host_fixtures.py onnx-inputs OUT``: model.onnx of the same model (MobileNet 0.25 @ 32 px, seed 0) as
``make`` exported, and input_names.txt: ONNX Runtime's input names for it, one a line, in order (what
the Java ``OrtSession.getInputNames()`` reports on a phone); ir_version.txt: its ONNX IR version.
``host_fixtures.py verify-secagg FILE``: what the Java secure-aggregation device sealed for its
neighbours (``secagg/case.json``'s round) must open in Python's sessions and give back its secrets.
``make`` also writes ``clipping/<case>/``: a received and a trained base and what Python's clipping
(``fedper.common.dp.clipping``, PROTOCOL.md "Clipping the base delta") uploads for them, with the bound,
the norm, the scale, the bit and the names' order in its metadata: the Java core must give the same bytes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

# The tensors both sides agree on (the Java tests hold the same numbers).
EXPECTED_FROM_JAVA = {
    "blocks.0.dw.conv.weight": np.array([[1.5, -2.25, 3.0e-8], [np.pi, -0.0, 1e30]], dtype=np.float32),
    "classifier.bias": np.array([0.1, 0.2, 0.3], dtype=np.float32),
}
JAVA_METADATA = {"num_samples": "12", "base_version": "3", "metric.accuracy": "0.75"}


def make(out: Path) -> None:
    from fedper.common.manifest import read_manifest, write_manifest
    from fedper.export.pipeline import write_server_only_export

    out.mkdir(parents=True, exist_ok=True)
    write_server_only_export(out / "artifacts", alpha=0.25, kp=2, seed=0)
    write_server_only_export(out / "artifacts-seed1", alpha=0.25, kp=2, seed=1)
    write_server_only_export(out / "artifacts-kp1", alpha=0.25, kp=1, seed=0)
    head_only = write_server_only_export(out / "artifacts-head", alpha=0.25, kp=2, seed=0)
    manifest = read_manifest(head_only, verify_files=False)
    training = dataclasses.replace(manifest.training, trainable="head")
    write_manifest(head_only, manifest.model_copy(update={"training": training}))
    tensors = {
        "stem.conv.weight": (np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2) - 7.5) / 3,
        "half": np.array([0.5, -2.0, 65504.0, 6.1035156e-05, 5.96e-08], dtype=np.float16),
        "scalar": np.array(42.0, dtype=np.float32),
    }
    save_file(tensors, str(out / "python_written.safetensors"), metadata={"note": "written by python", "n": "7"})
    clipping_cases(out / "clipping", out / "artifacts")
    secagg_case(out / "secagg")


def clipping_cases(out: Path, artifacts: Path) -> None:
    """The real base (kp 2, MobileNet 0.25) moved by training-sized noise, clipped (0.5) and within
    the bound (10); and a base 300x larger with a bound of 1e-3, where rounding to float32 makes
    the first scale land above the bound and the margins are needed."""
    from fedper.common import weights
    from fedper.common.dp.clipping import clip_delta
    from fedper.common.manifest import ARTIFACT_FILES, read_manifest

    manifest = read_manifest(artifacts, verify_files=False)
    names = manifest.base_names
    base = weights.load(artifacts / ARTIFACT_FILES["initial_base"])
    rng = np.random.default_rng(31)
    trained = {n: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in base.items()}
    large = {n: (300 * v).astype(np.float32) for n, v in base.items()}
    large_trained = {n: (v + 1e-6 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in large.items()}
    cases = {"clipped": (base, trained, 0.5), "within": (base, trained, 10.0), "margins": (large, large_trained, 1e-3)}
    for case, (received, moved, bound) in cases.items():
        clipped = clip_delta(moved, received, names, bound)
        if case == "margins":
            assert clipped.scale < bound / clipped.norm, "the margins case must need a margin"
        folder = out / case
        folder.mkdir(parents=True, exist_ok=True)
        save_file({n: received[n] for n in names}, str(folder / "received.safetensors"))
        save_file({n: moved[n] for n in names}, str(folder / "trained.safetensors"))
        meta = {"bound": repr(bound), "norm": repr(clipped.norm), "scale": repr(clipped.scale),
                "unclipped": "1" if clipped.unclipped else "0", "names": ",".join(names)}  # fmt: skip
        save_file(clipped.tensors, str(folder / "expected.safetensors"), metadata=meta)


SECAGG_SESSION = "a11ce5e55100000000000000000000f1"  # a task's secagg.session: 32 lowercase hex digits
SECAGG_DEVICES = ("a-1", "java", "z-1", "z-2")  # the Java device has a smaller and larger neighbours
SECAGG_THRESHOLD = 2


def _secagg_sessions():  # type: ignore[no-untyped-def]
    """The round's devices with fixed keys and seeds (derived from their names), Python's sessions."""
    import hashlib

    from fedper.common.secagg import keys
    from fedper.common.secagg.device_session import DeviceSession

    def secret(name: str, what: str) -> bytes:
        return hashlib.sha256(f"{name} {what}".encode()).digest()

    return {
        n: DeviceSession(n, SECAGG_SESSION.encode(), keys.KeyPairs(keys.private_key(secret(n, "channel")),
                                                                   keys.private_key(secret(n, "mask"))),
                         secret(n, "seed"))
        for n in SECAGG_DEVICES
    }, secret  # fmt: skip


def secagg_case(out: Path) -> None:
    """secagg/case.json: a round of four devices, everyone each other's neighbour, one of them the
    Java device: the session, the threshold, the Java device's private keys and seed, and every
    device's public keys (Python's). The byte-for-byte checks are docs/secagg_vectors.json's
    (SecAggVectorsTest); this case is for ``verify-secagg``, which takes what the Java device,
    with its own random coefficients and nonces, sealed for the other three."""
    import json

    sessions, secret = _secagg_sessions()
    ads = {n: s.advertise() for n, s in sessions.items()}
    case = {
        "session": SECAGG_SESSION,
        "threshold": SECAGG_THRESHOLD,
        "java": {what: secret("java", what).hex() for what in ("channel", "mask", "seed")},
        "advertised": {n: {"channel": a.channel.hex(), "mask": a.mask.hex()} for n, a in ads.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "case.json").write_text(json.dumps(case, indent=1) + "\n")


def verify_secagg(path: Path) -> int:
    """What the Java device sealed for its neighbours (JSON: receiver -> hex), taken by Python's
    sessions of the three neighbours beside each other's messages: each must open the Java
    device's (none lists it as unopened); asked for the Java device's mask key (as if it dropped)
    and, in a second run of the round, for its seed (as if it survived), their three answers must
    fit one polynomial and give back the Java device's mask key and seed."""
    import json

    from fedper.common.secagg import shamir
    from fedper.common.secagg.device_session import SEALED_BYTES

    java_sealed = {n: bytes.fromhex(v) for n, v in json.loads(path.read_text()).items()}
    python = [n for n in SECAGG_DEVICES if n != "java"]
    if sorted(java_sealed) != python:
        print(f"sealed for {sorted(java_sealed)}, not {python}")
        return 1
    if any(len(c) != SEALED_BYTES for c in java_sealed.values()):
        print(f"sealed messages of {sorted({len(c) for c in java_sealed.values()})} bytes, not {SEALED_BYTES}")
        return 1
    recovered = []
    for java_dropped in (True, False):
        sessions, secret = _secagg_sessions()
        ads = {n: s.advertise() for n, s in sessions.items()}
        sealed = {n: sessions[n].share_keys({m: ads[m] for m in SECAGG_DEVICES if m != n}, SECAGG_THRESHOLD)
                  for n in python}  # fmt: skip
        answers = []
        for name in python:
            others = [m for m in python if m != name]
            sessions[name].receive_shares({**{m: sealed[m][name] for m in others}, "java": java_sealed[name]})
            if sessions[name].unopened:
                print(f"{name} could not open the messages of {sessions[name].unopened}")
                return 1
            dropped, survivors = (["java"], others) if java_dropped else ([], ["java", *others])
            answers.append(shamir.Share.from_bytes(sessions[name].unmask(dropped, survivors)["java"]))
        value, wrong = shamir.recover(answers, SECAGG_THRESHOLD)
        if wrong:
            print(f"the shares of holders {wrong} do not fit the others")
            return 1
        recovered.append(value)
    if recovered != [secret("java", "mask"), secret("java", "seed")]:
        print("the Java device's shares do not give back its mask key and seed")
        return 1
    return 0


def onnx_inputs(out: Path) -> None:
    import onnx
    import onnxruntime

    from fedper.common.manifest import read_manifest
    from fedper.export.onnx_export import export_onnx
    from fedper.models import ModelConfig, build_model

    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out.parent / "artifacts", verify_files=False)  # written by `make` first
    model = build_model(ModelConfig(**manifest.model.model_dump()), seed=0)
    names = manifest.base_names + manifest.head_names
    (out / "model.onnx").write_bytes(export_onnx(model, manifest.model.input_size, names))
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"])
    (out / "input_names.txt").write_text("".join(f"{i.name}\n" for i in session.get_inputs()))
    (out / "ir_version.txt").write_text(f"{onnx.load(str(out / 'model.onnx')).ir_version}\n")


def verify(path: Path) -> int:
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
    if metadata != JAVA_METADATA:
        print(f"metadata {metadata} != {JAVA_METADATA}")
        return 1
    if sorted(tensors) != sorted(EXPECTED_FROM_JAVA):
        print(f"names {sorted(tensors)}")
        return 1
    for name, want in EXPECTED_FROM_JAVA.items():
        got = tensors[name]
        if got.dtype != np.float32 or got.shape != want.shape or got.tobytes() != want.tobytes():
            print(f"{name}: {got!r} != {want!r}")
            return 1
    return 0


if __name__ == "__main__":
    command, target = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        make(target)
    elif command == "onnx-inputs":
        onnx_inputs(target)
    elif command == "verify-secagg":
        sys.exit(verify_secagg(target))
    else:
        sys.exit(verify(target))
