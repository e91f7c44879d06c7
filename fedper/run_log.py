"""The run's log: where other libraries' output goes, so the terminal shows the toolkit's own.

torch reports deprecations through its loggers (``W1203 ... torch/utils/_pytree.py:630] ...``),
native libraries may write straight to file descriptor 2, and libraries warn through
:mod:`warnings`. Inside
:func:`third_party_output_to`, descriptor 2 is the run's log; so is every other library's
logging handler that wrote to the terminal (torch's follows ``sys.stderr`` wherever it points,
so it is swapped for one on the log) and every warning. ``sys.stderr`` itself, which the
toolkit's consoles print to, still reaches the terminal.

Not yet caught: ExecuTorch's ``[cpuinfo_utils.cpp:...]`` lines in ``fedper demo`` reach the
terminal through another path (issue 30's note at stop 41 has what was measured).
"""

from __future__ import annotations

import contextlib
import logging
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
    swapped = _libraries_handlers_to(old_stderr, terminals=(old_stderr, terminal, sys.stdout, sys.__stderr__))
    try:
        yield
    finally:
        for logger, handlers in swapped:
            logger.handlers[:] = handlers
        warnings.showwarning = old_showwarning
        terminal.flush()
        old_stderr.flush()
        sys.stderr = old_stderr
        os.dup2(terminal_fd, 2)
        terminal.close()


def _libraries_handlers_to(
    log: TextIO, terminals: tuple[object, ...]
) -> list[tuple[logging.Logger, list[logging.Handler]]]:
    """Every non-fedper logger's handlers that print to a terminal stream, replaced by ones on
    ``log`` (same level, format and filters); returns what to put back."""
    swapped = []
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or name.split(".")[0] == "fedper":
            continue
        handlers = list(logger.handlers)
        to_terminal = [
            h for h in handlers if not isinstance(h, logging.FileHandler) and getattr(h, "stream", None) in terminals
        ]
        if not to_terminal:
            continue
        replaced = []
        for h in handlers:
            if h not in to_terminal:
                replaced.append(h)
                continue
            on_log = logging.StreamHandler(log)
            on_log.setLevel(h.level)
            on_log.setFormatter(h.formatter)
            for f in h.filters:
                on_log.addFilter(f)
            replaced.append(on_log)
        logger.handlers[:] = replaced
        swapped.append((logger, handlers))
    return swapped
