"""How many threads a device computes with: torch's (the eager engine, ONNX Runtime's scoring
follows it) and ExecuTorch's thread pool (the training program's parallel kernels and its
XNNPACK-delegated matrix products).

ExecuTorch has one pool per process, and an XNNPACK delegate keeps the pool it was loaded with:
the count is set once, before any program is loaded (a device or fleet worker's start).
"""

from __future__ import annotations

import os

from fedper.common.errors import ConfigError


def set_compute_threads(threads: int) -> int:
    """Use ``threads`` compute threads (0: one per core of this machine); returns the count."""
    if threads < 0:
        raise ConfigError(f"--threads must be 0 (every core) or more, not {threads}")
    count = threads or os.cpu_count() or 1
    import torch
    from executorch.extension.pybindings.portable_lib import (
        _threadpool_get_thread_count,
        _unsafe_reset_threadpool,
    )

    torch.set_num_threads(count)
    if _threadpool_get_thread_count() != count:
        _unsafe_reset_threadpool(count)
    return count
