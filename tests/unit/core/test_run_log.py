"""Other libraries' output goes to the run's log; the toolkit's console stays on the terminal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

# In a child process, so that its descriptor 2 is a pipe this test reads: the ways third-party
# output reaches a terminal (torch's own logging handler, which follows sys.stderr; a handler made
# on the stderr of its time; a C library writing to descriptor 2, as ExecuTorch's runtime does;
# warnings; ExecuTorch's log lines, which its bindings write to sys.stderr), and the toolkit's rich
# console; then the same after the context, back on the terminal.
CHILD = textwrap.dedent(
    """
    import ctypes, logging, sys, warnings
    from pathlib import Path
    from rich.console import Console
    from fedper.run_log import third_party_output_to

    import torch  # its loggers' handler follows sys.stderr wherever it points

    handler = logging.StreamHandler()
    logging.getLogger("onnxscript").addHandler(handler)
    libc = ctypes.CDLL(None)
    console = Console(stderr=True)
    with third_party_output_to(Path(sys.argv[1])):
        logging.getLogger("torch.utils._pytree").warning("W1203 pytree deprecation")
        logging.getLogger("onnxscript").warning("a handler on the stderr of its time")
        line = b"[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version\\n"
        libc.write(2, line, len(line))
        warnings.warn("ExperimentalWarning from a library")
        # ExecuTorch's bindings hand the runtime's log to sys.stderr in pieces, each flushed (measured).
        for piece in ["[", "threadpool.cpp", ":", "66", "] ", "Resetting threadpool to 1 threads.", "\\n"]:
            sys.stderr.write(piece)
            sys.stderr.flush()
        console.print("1/4 exporting (the toolkit's own line)")
    console.print("after the run")
    libc.write(2, b"C after\\n", 8)
    """
)


def test_third_party_output_goes_to_the_log_and_the_console_to_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "out" / "demo.log"
    done = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, check=True)
    terminal = done.stderr
    assert "1/4 exporting (the toolkit's own line)" in terminal and "after the run" in terminal
    assert "C after" in terminal  # descriptor 2 is the terminal's again
    noises = ("W1203 pytree deprecation", "a handler on the stderr of its time", "[cpuinfo_utils.cpp:71]",
              "ExperimentalWarning from a library", "[threadpool.cpp:66] Resetting threadpool")  # fmt: skip
    for noise in noises:
        assert noise not in terminal, terminal
        assert noise in log.read_text()
    assert "toolkit's own line" not in log.read_text()


# The device's logging inside the run log: the toolkit's records on the terminal, a library's
# (httpx logs each request at INFO) in the log; afterwards the root logger is as it was.
RECORDS_CHILD = textwrap.dedent(
    """
    import logging, sys
    from pathlib import Path
    from fedper.run_log import third_party_output_to, toolkit_records_to_terminal

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    with third_party_output_to(Path(sys.argv[1])), toolkit_records_to_terminal():
        logging.getLogger("fedper.device").info("device d-1: not in round 3's cohort; asking again")
        logging.getLogger("httpx").info('HTTP Request: GET http://server/v1/task "HTTP/1.1 204"')
    assert (list(root.handlers), root.level) == before, (root.handlers, root.level)
    logging.getLogger("fedper.device").warning("after the run: no handler of the run's is left")
    """
)


def test_the_toolkits_records_go_to_the_terminal_and_a_librarys_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "device" / "device.log"
    done = subprocess.run([sys.executable, "-c", RECORDS_CHILD, str(log)], capture_output=True, text=True, check=True)
    assert "not in round 3's cohort" in done.stderr and "HTTP Request" not in done.stderr
    assert "HTTP Request: GET http://server/v1/task" in log.read_text() and "cohort" not in log.read_text()
    assert "after the run" in done.stderr and "Logging error" not in done.stderr  # Python's last-resort handler
