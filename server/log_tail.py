"""The server's last log lines in memory, for the operator's dashboard."""

from __future__ import annotations

import logging
import threading
from collections import deque

LOG_TAIL_LINES = 200


class LogTail(logging.Handler):
    """Keeps the last ``LOG_TAIL_LINES`` records of the ``fedper.server`` logger at INFO and up,
    formatted as the server's log file has them (one JSON event per line after the level)."""

    def __init__(self, lines: int = LOG_TAIL_LINES) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self._lines: deque[str] = deque(maxlen=lines)
        self._tail_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record).splitlines()[0][:2000]  # a traceback stays in the log file
        except Exception:  # a handler must not raise into the code that logged
            self.handleError(record)
            return
        with self._tail_lock:
            self._lines.append(line)

    def lines(self, last: int) -> list[str]:
        with self._tail_lock:
            return list(self._lines)[-last:]
