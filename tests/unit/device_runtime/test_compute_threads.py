"""``--threads``: one setting for both engines' threads, applied before a program is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fedper.cli import main
from fedper.common.errors import ConfigError
from fedper.device_runtime.runtime_config import RuntimeConfig

PROBE = """
import json, sys
import torch
from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count
from fedper.device_runtime.compute_threads import set_compute_threads
applied = set_compute_threads(int(sys.argv[1]))
print(json.dumps([applied, torch.get_num_threads(), _threadpool_get_thread_count()]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, 0])
def test_both_engines_get_the_count(threads: int) -> None:
    # A fresh process: the ExecuTorch pool is one per process, and the suite's own must not change.
    out = subprocess.run([sys.executable, "-c", PROBE, str(threads)], capture_output=True, text=True, check=True)
    expected = threads or os.cpu_count()
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [expected] * 3


def test_a_negative_count_is_a_clear_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDPER_ENROLLMENT_KEY", raising=False)  # refused before the key is looked for
    with pytest.raises(ConfigError, match="--threads"):
        RuntimeConfig(threads=-1)
    assert main(["device", "--threads", "-1", "--storage", "/nonexistent/device"]) == 2
    assert "--threads must be 0 (every core) or more" in capsys.readouterr().err
