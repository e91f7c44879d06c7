"""The run's log: where other libraries' output goes, so the terminal shows the toolkit's own.

torch reports deprecations through its loggers (``W1203 ... torch/utils/_pytree.py:630] ...``),
native libraries may write straight to file descriptor 2, and libraries warn through
:mod:`warnings`. Inside :func:`third_party_output_to`, descriptor 2 is the run's log; so is
every other library's logging handler that wrote to the terminal (torch's follows
``sys.stderr`` wherever it points, so it is swapped for one on the log) and every warning.
``sys.stderr`` itself, which the toolkit's consoles print to, still reaches the terminal, but
for ExecuTorch's log lines: its Python bindings hand the runtime's C++ output
(``[cpuinfo_utils.cpp:71] Reading file ...``) to ``sys.stderr`` through pybind11's stream
redirect, one flushed piece at a time, so they can only be told from the toolkit's by their
form, ``[file.cpp:line] message``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO, cast


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
    sorted_stderr = _RuntimeLinesTo(old_stderr, terminal)
    sys.stderr = cast(TextIO, sorted_stderr)

    def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: TextIO | None = None, line: str | None = None) -> None:  # fmt: skip
        old_stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
        old_stderr.flush()

    warnings.showwarning = to_log
    swapped = _libraries_handlers_to(old_stderr, terminals=(old_stderr, sorted_stderr, sys.stdout, sys.__stderr__))
    try:
        yield
    finally:
        for logger, handlers in swapped:
            logger.handlers[:] = handlers
        warnings.showwarning = old_showwarning
        sorted_stderr.flush()
        old_stderr.flush()
        sys.stderr = old_stderr
        os.dup2(terminal_fd, 2)
        sorted_stderr.close()


@contextlib.contextmanager
def toolkit_records_to_terminal(level: int = logging.INFO) -> Iterator[None]:
    """Inside :func:`third_party_output_to`: the root logger prints the toolkit's records
    (``fedper.*``) on the terminal and every other library's (httpx's request lines, say) into
    the run's log, at ``level``; as it was again afterwards."""
    formatter = logging.Formatter("%(message)s")
    toolkit = logging.Filter("fedper")
    terminal = logging.StreamHandler(sys.stderr)
    terminal.addFilter(toolkit)
    log = logging.StreamHandler(sys.__stderr__)  # descriptor 2: the run's log here
    log.addFilter(lambda record: not toolkit.filter(record))
    root = logging.getLogger()
    old_level = root.level
    for handler in (terminal, log):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(terminal)
        root.removeHandler(log)
        root.setLevel(old_level)


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
        replaced = [_same_handler_on(log, h) if _to_terminal(h, terminals) else h for h in handlers]
        if replaced != handlers:
            logger.handlers[:] = replaced
            swapped.append((logger, handlers))
    return swapped


def _to_terminal(handler: logging.Handler, terminals: tuple[object, ...]) -> bool:
    return not isinstance(handler, logging.FileHandler) and getattr(handler, "stream", None) in terminals


def _same_handler_on(log: TextIO, handler: logging.Handler) -> logging.Handler:
    """A handler like ``handler`` (level, format, filters) that writes to ``log``."""
    on_log = logging.StreamHandler(log)
    on_log.setLevel(handler.level)
    on_log.setFormatter(handler.formatter)
    for f in handler.filters:
        on_log.addFilter(f)
    return on_log


# ExecuTorch's ET_LOG form: "[cpuinfo_utils.cpp:71] Reading file ...".
_RUNTIME_LINE = re.compile(r"\[[\w./-]+\.(?:cpp|cc|c|h):\d+\] ")


class _RuntimeLinesTo:
    """The terminal, but ExecuTorch's log lines go to ``log``. Text that cannot be the start of
    such a line passes through at once (progress bars are not held back); text that can waits
    for its newline, flush or not."""

    def __init__(self, log: TextIO, terminal: TextIO) -> None:
        self._log, self._terminal, self._pending = log, terminal, ""
        self.encoding, self.errors = terminal.encoding, terminal.errors

    def write(self, text: str) -> int:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            (self._log if _RUNTIME_LINE.match(line) else self._terminal).write(line + "\n")
        if self._pending and not self._pending.startswith("["):
            self._terminal.write(self._pending)
            self._pending = ""
        return len(text)

    def flush(self) -> None:
        # The bindings flush after every piece ("[" first): a possible runtime line waits for its end.
        self._terminal.flush()
        self._log.flush()

    def isatty(self) -> bool:
        return self._terminal.isatty()

    def fileno(self) -> int:
        return self._terminal.fileno()

    def close(self) -> None:
        if self._pending:
            self._terminal.write(self._pending)
            self._pending = ""
        self._terminal.close()
