"""docs/regional_vectors.json is what the toolkit computes (fedper.common.hierarchical, which the
root and the regional servers run), and an implementation written from PROTOCOL.md, "Regional
aggregation (revision 1.9)", alone (here: hashlib, json, struct and numpy) reproduces it: the
region rule, a region's sum and the bytes it forwards, the root's combination to the bit."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from fedper.common import hierarchical, weights

DOCS = Path(__file__).resolve().parents[3] / "docs"
VECTORS = json.loads((DOCS / "regional_vectors.json").read_text())
LAYOUT = [(name, tuple(shape)) for name, shape in VECTORS["layout"]]


def test_the_vector_file_is_what_the_code_computes() -> None:
    spec = importlib.util.spec_from_file_location("regional_vectors", DOCS / "scripts" / "regional_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "docs/regional_vectors.json is stale: run docs/scripts/regional_vectors.py"


def test_the_region_rule_from_the_protocol_alone() -> None:
    for case in VECTORS["region_of"]:
        digest = hashlib.sha256(case["device_id"].encode("utf-8")).digest()
        assert int.from_bytes(digest[:8], "big") % case["regions"] == case["region"], case


def _read(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A safetensors body as PROTOCOL.md describes it: an 8-byte little-endian header length, the
    JSON header, then each tensor's little-endian bytes at its offsets."""
    (length,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + length])
    metadata = header.pop("__metadata__")
    data = body[8 + length :]
    out = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F64"
        start, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype="<f8").reshape(entry["shape"])
    return out, metadata


def test_a_regions_sum_and_its_bytes_and_the_roots_result_from_the_protocol_alone() -> None:
    forwarded = []
    for case in [*VECTORS["regional_sums"], VECTORS["dp_regional_sum"]]:
        body = bytes.fromhex(case["body_hex"])
        assert hashlib.sha256(body).hexdigest() == case["body_sha256"]
        tensors, metadata = _read(body)
        expected = {"sum_region": str(case["region"]), "sum_weight": str(case["weight"]),
                    "sum_count": str(case["count"]), "base_version": str(case["base_version"])}  # fmt: skip
        if "unclipped" in case:  # under DP-FedAvg
            expected["dp_unclipped"] = str(case["unclipped"])
        assert metadata == expected
        for name, shape in LAYOUT:
            acc = np.zeros(shape, dtype=np.float64)
            for update in case["updates"]:  # one at a time, in the order given (the canonical one)
                values = np.array(update["tensors"][name], dtype=np.float32).reshape(shape)
                acc = acc + update["num_samples"] * values.astype(np.float64)
            assert acc.tobytes() == tensors[name].tobytes() == np.array(case["weighted_sum"][name]).tobytes()
        if "unclipped" not in case:
            forwarded.append((case["region"], tensors, case["weight"]))
    total = float(sum(weight for _, _, weight in forwarded))
    for name, shape in LAYOUT:
        acc = np.zeros(shape, dtype=np.float64)
        for _, tensors, _ in sorted(forwarded, key=lambda f: f[0]):
            acc = acc + tensors[name]
        mean = (acc / total).astype(np.float32)  # one division, then one rounding to float32
        assert mean.astype("<f4").tobytes().hex() == VECTORS["combined"][name]["hex"], name


@pytest.mark.parametrize("case", VECTORS["refused"], ids=lambda c: c["why"])
def test_a_body_the_root_refuses_is_refused_by_the_reader_with_its_code(case: dict[str, str]) -> None:
    body = bytes.fromhex(case["body_hex"])
    with pytest.raises(weights.WeightsError) as refused:
        hierarchical.decode(body, LAYOUT)
    malformed = isinstance(refused.value, hierarchical.MalformedSumError)
    assert ("malformed_safetensors" if malformed else "bad_regional_sum") == case["code"]
