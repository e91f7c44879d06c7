"""Writes docs/regional_vectors.json: known-answer vectors of regional aggregation (PROTOCOL.md,
"Regional aggregation (revision 1.9)"), for any implementation of a regional server or a root to
check itself against: the region rule, a region's sum and its bytes, the root's combination, and
bodies the root refuses with the code it answers.

The inputs are written into the file (a reader needs none of this script). Run from the
repository's root: ``.venv/bin/python docs/scripts/regional_vectors.py`` (``--check``: exit 1 if
the file differs from what the code gives now; tests/unit/common/test_regional_vectors.py does
the same, and checks the file with an implementation written from PROTOCOL.md alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedper.common import hierarchical, weights
from fedper.common.protocol import Metadata

OUT = Path(__file__).resolve().parents[1] / "regional_vectors.json"
LAYOUT = [("a.weight", (2, 3)), ("b.bias", (2,))]
DEVICE_IDS = ["d-0", "d-1", "phone-42", "9f86d081884c7d65", ""]


def _update(seed: int) -> dict[str, np.ndarray]:
    """float32 values with few bits (sums of them are exact in float64; the division is not)."""
    rng = np.random.default_rng(seed)
    return {name: (rng.integers(-64, 64, shape) / 16).astype(np.float32) for name, shape in LAYOUT}


def _floats(array: np.ndarray) -> list[float]:
    return [float(v) for v in array.ravel()]


def vectors() -> dict[str, object]:
    region_rule = [{"device_id": d, "regions": r, "region": hierarchical.region_of(d, r)}
                   for d in DEVICE_IDS for r in (1, 2, 3, 10)]  # fmt: skip
    sums, cases = [], []
    for region, seeds in ((0, (1, 2, 3)), (1, (4, 5))):
        updates = [(_update(s), 3 + s) for s in seeds]
        summed = hierarchical.regional_sum(LAYOUT, region, updates, base_version=4)
        data = hierarchical.encode(summed)
        sums.append(summed)
        cases.append({
            "region": region, "base_version": 4,
            "updates": [{"num_samples": n, "tensors": {k: _floats(v) for k, v in t.items()}} for t, n in updates],
            "weighted_sum": {k: _floats(v) for k, v in summed.weighted_sum.items()},
            "weight": summed.weight, "count": summed.count,
            "body_hex": data.hex(), "body_sha256": hashlib.sha256(data).hexdigest(),
        })  # fmt: skip
    # Under DP-FedAvg every weight is 1 and the sum says how many of its deltas were unclipped.
    private = hierarchical.regional_sum(LAYOUT, 1, [(_update(s), 1) for s in (6, 7)], base_version=4)
    private = replace(private, unclipped=1)
    data = hierarchical.encode(private)
    dp_case = {
        "region": 1, "base_version": 4, "unclipped": 1,
        "updates": [{"num_samples": 1, "tensors": {k: _floats(v) for k, v in _update(s).items()}} for s in (6, 7)],
        "weighted_sum": {k: _floats(v) for k, v in private.weighted_sum.items()},
        "weight": private.weight, "count": private.count,
        "body_hex": data.hex(), "body_sha256": hashlib.sha256(data).hexdigest(),
    }  # fmt: skip
    combined = hierarchical.combine(LAYOUT, sums)
    good = sums[0]
    metadata = _metadata(good)
    partial = hierarchical.RegionalSum(0, {"a.weight": good.weighted_sum["a.weight"]}, 5, 1, 4)
    nan = hierarchical.RegionalSum(0, {**good.weighted_sum, "b.bias": np.array([1.0, np.nan])}, 5, 1, 4)
    signed = weights.encode(good.weighted_sum, {**metadata, Metadata.WEIGHT: f"+{good.weight}"}, dtype=np.float64)
    refused = [
        {"why": why, "body_hex": body.hex(), "code": code}
        for why, body, code in (
            ("not safetensors", b"fedper", "malformed_safetensors"),
            ("float32, not float64", weights.encode(good.weighted_sum, metadata), "bad_regional_sum"),
            ("a tensor missing", hierarchical.encode(partial), "bad_regional_sum"),
            ("weight spelled with a sign", signed, "bad_regional_sum"),
            ("count above weight", hierarchical.encode(hierarchical.RegionalSum(0, good.weighted_sum, 2, 3, 4)),
             "bad_regional_sum"),
            ("a NaN", hierarchical.encode(nan), "bad_regional_sum"),
            ("an unknown metadata key", weights.encode(good.weighted_sum, {**metadata, "note": "x"}, dtype=np.float64),
             "bad_regional_sum"),
            ("more unclipped deltas than deltas", hierarchical.encode(replace(good, unclipped=good.count + 1)),
             "bad_regional_sum"),
        )
    ]  # fmt: skip
    return {
        "description": "Known-answer vectors of regional aggregation, PROTOCOL.md 'Regional aggregation (revision "
        "1.9)'. Written by docs/scripts/regional_vectors.py; do not edit.",
        "layout": [[name, list(shape)] for name, shape in LAYOUT],
        "region_of": region_rule,
        "regional_sums": cases,
        "dp_regional_sum": dp_case,
        "combined": {
            name: {"float32": _floats(v), "hex": v.astype("<f4").tobytes().hex()} for name, v in combined.items()
        },
        "refused": refused,
    }


def _metadata(summed: hierarchical.RegionalSum) -> dict[str, str]:
    return {Metadata.REGION: str(summed.region), Metadata.WEIGHT: str(summed.weight),
            Metadata.COUNT: str(summed.count), Metadata.BASE_VERSION: str(summed.base_version)}  # fmt: skip


def text() -> str:
    return json.dumps(vectors(), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not what the code gives")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if OUT.exists() and OUT.read_text() == text() else 1
    OUT.write_text(text())
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
