"""docs/secagg_vectors.json is what the toolkit's secure aggregation computes (the server's and the
Python device's sides), so the vectors a third party checks itself against are the toolkit's own.
The Android core checks the same file (SecAggVectorsTest); an implementation from the docs alone
too (tests/integration/test_secagg_independent.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "docs" / "scripts" / "secagg_vectors.py"


def test_the_vector_file_is_what_the_code_computes() -> None:
    spec = importlib.util.spec_from_file_location("secagg_vectors", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "docs/secagg_vectors.json is stale: run docs/scripts/secagg_vectors.py"
