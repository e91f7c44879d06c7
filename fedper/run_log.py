"""The run's log: where other libraries' output goes, so the terminal shows the toolkit's own.

torch reports deprecations through its loggers (``W1203 ... torch/utils/_pytree.py:630] ...``),
ExecuTorch's C++ runtime writes lines such as ``[cpuinfo_utils.cpp:71] Reading file ...``
straight to file descriptor 2, and libraries warn through :mod:`warnings`. Inside
:func:`third_party_output_to`, descriptor 2 is the run's log, and so is every handler that was
writing to the old ``sys.stderr``; ``sys.stderr`` itself, which the toolkit's consoles print
to, still reaches the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def third_party_output_to(log: Path) -> Iterator[None]:
    """Descriptor 2 and Python warnings into ``log`` (appended); ``sys.stderr`` stays on the terminal."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal_fd = os.dup(2)
    old_stderr, old_showwarning = sys.stderr, warnings.showwarning
    terminal = os.fdopen(terminal_fd, "w", buffering=1, encoding=old_stderr.encoding, errors="backslashreplace")
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = terminal

    def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: TextIO | None = None, line: str | None = None) -> None:  # fmt: skip
        old_stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
        old_stderr.flush()

    warnings.showwarning = to_log
    try:
        yield
    finally:
        warnings.showwarning = old_showwarning
        terminal.flush()
        old_stderr.flush()
        sys.stderr = old_stderr
        os.dup2(terminal_fd, 2)
        terminal.close()
