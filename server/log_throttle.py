"""Repeated warnings and errors, logged at a bounded rate.

A client can make the server fail the same way thousands of times a second (a file-descriptor
flood makes every accept() fail with a traceback): logged each time, that fills the disk, and
a full disk stops the server. Each kind of record (its logger, its event or message template,
its exception type) is logged at most ``limit`` times per ``window`` seconds; the rest are
counted, and one line says how many were left out when the kind is next logged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KINDS = 1000


def kind(record: logging.LogRecord) -> tuple[str, ...]:
    """What makes two records the same kind: our JSON lines by their ``event``, others by their
    message template, both with the exception's type."""
    template = str(record.msg)
    try:
        parsed = json.loads(template)
        if isinstance(parsed, dict) and "event" in parsed:
            template = str(parsed["event"])
    except ValueError:
        pass
    exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
    return record.name, template[:200], exc


class RepeatedLogFilter(logging.Filter):
    """Attach to a handler: records of WARNING and above beyond the rate are dropped."""

    def __init__(self, limit: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.limit, self.window, self._clock = limit, window, clock
        self._kinds: OrderedDict[tuple[str, ...], list[float]] = OrderedDict()  # [window start, logged, dropped]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key, now, dropped = kind(record), self._clock(), 0
        with self._lock:
            seen = self._kinds.get(key)
            if seen is not None and now - seen[0] < self.window:
                if seen[1] >= self.limit:
                    seen[2] += 1
                    return False
                seen[1] += 1
                return True
            dropped = int(seen[2]) if seen is not None else 0
            self._kinds[key] = [now, 1, 0]
            self._kinds.move_to_end(key)
            while len(self._kinds) > MAX_KINDS:
                self._kinds.popitem(last=False)
        if dropped:  # a record of its own (a kind of its own), after the lock
            summary = {"event": "log_suppressed", "kind": list(key), "dropped": dropped, "window_seconds": self.window}
            logging.getLogger("fedper.server").warning(json.dumps(summary))
        return True


def throttle_root_handlers(limit: int = 10, window: float = 60.0) -> None:
    """Add the filter to every handler of the root logger (where the server's, uvicorn's and
    asyncio's records end up)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatedLogFilter(limit, window))
