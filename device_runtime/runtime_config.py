"""How a device runs: one definition shared by ``fedper device``, ``fedper fleet`` and ``fedper demo``.

Apart from the runtime itself so a config (and the hosts that read it) imports no training stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError

Engine = Literal["executorch", "eager"]
# ONNX Runtime takes batches; the ExecuTorch inference program is batch-1 and ~5x slower here.
Evaluator = Literal["onnx", "executorch"]


@dataclass(frozen=True)
class RuntimeConfig:
    """Which server a device talks to, what trains and scores its model, on how many threads, and
    the key it enrolls with; a fleet's devices all share one."""

    server: str = option("http://127.0.0.1:8000", "server URL")
    engine: Engine = option("executorch", "training engine: the exported program, or eager PyTorch")
    evaluator: Evaluator = option("onnx", "exported model that scores the local test split (executorch engine)")
    threads: int = option(
        0,
        "compute threads of the device's process, or of each worker process or Ray actor of a fleet: torch's and "
        "ExecuTorch's thread pool (0 = one per core; a fleet's default, 1, lets its workers share the cores: "
        "docs/PERFORMANCE.md)",
    )
    enrollment_key_file: Path | None = option(
        None, "file holding the enrollment key (else FEDPER_ENROLLMENT_KEY)", metavar="FILE"
    )

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ConfigError("--threads must be 0 (every core) or more")
