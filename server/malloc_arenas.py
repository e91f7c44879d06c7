"""Fewer glibc malloc arenas for the server process.

glibc gives threads that allocate concurrently their own malloc arenas (up to 8 per core), and
an arena keeps much of what was freed in it. The server validates uploads in a pool of worker
threads, each holding one body's tensors for a moment, so with the default its resident memory
grows with how many threads ever held a body, not with the uploads in flight: 50 concurrent
width-1.0 uploads (8 MB each) grew it by 95-202 MB here, and by 18-41 MB with 2 arenas
(``tests/unit/server/test_server.py::test_fifty_concurrent_width1_devices``). The operator's own
``MALLOC_ARENA_MAX`` wins; elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Ask glibc for at most ``arenas`` arenas from now on; True if it agreed."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))
