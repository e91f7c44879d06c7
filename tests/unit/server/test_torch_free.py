"""The modules the aggregation server imports must not pull in torch (the server runs without it)."""

import subprocess
import sys

SERVER_SIDE = [
    "fedper.common.weights",
    "fedper.common.aggregate",
    "fedper.common.robust_aggregate",
    "fedper.common.metrics",
    "fedper.common.manifest",
    "fedper.common.atomic_write",
]


def test_server_side_modules_do_not_import_torch():
    code = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in SERVER_SIDE)
        + "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        + "assert not loaded, loaded\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
