"""``fedper serve`` as a child process on 127.0.0.1, ready when ``/v1/health`` answers: the one
way the demo, the tests and the benchmarks start a server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fedper.common.protocol import Route
from fedper.server.metrics_registry import METRICS_PATH


def free_port() -> int:
    """A TCP port nobody listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_answering(url: str, proc: subprocess.Popen[str], timeout: float, log: Path | None = None) -> None:
    """Poll ``url`` until it answers 200; a child that exits first, or the timeout, is an error
    that carries the end of the child's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"the server exited with status {proc.returncode}; log {log}:\n{tail}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer {url} within {timeout:.0f} s; log: {log}")


def metric_sample(exposition: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition (``/metrics``) with exactly these labels (none: the
    unlabelled one), read with the client library's own parser; 0 when the server has not
    recorded it yet."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def option_flags(options: Mapping[str, object]) -> list[str]:
    """``fedper serve``'s flags for ``options``: ``target_clients=3`` -> ``--target-clients 3``,
    ``dp=True`` -> ``--dp``, ``dp=False`` -> ``--no-dp``."""
    args: list[str] = []
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        args += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    return args


class ServerProcess:
    """One ``fedper serve``: ``options`` become its flags (``target_clients=3`` ->
    ``--target-clients 3``), ``env`` its environment (secrets), ``log`` gets its output;
    ``python`` is the interpreter whose installed fedper serves (this one by default)."""

    def __init__(
        self,
        artifacts: Path,
        data_dir: Path,
        options: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        port: int | None = None,
        python: Path | str = sys.executable,
    ) -> None:
        self.artifacts, self.data_dir = artifacts, data_dir
        self.options = dict(options or {})
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.log = log or data_dir.parent / f"{data_dir.name}.log"
        self.python = python
        self.proc: subprocess.Popen[str] | None = None
        self._log_file: IO[str] | None = None

    def start(self, timeout: float = 60) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("already started (use either start() or `with`, not both)")
        # -P: the installed fedper, never a folder of that name in the working directory.
        args = [str(self.python), "-P", "-m", "fedper.cli", "serve", "--artifacts", str(self.artifacts),
                "--data-dir", str(self.data_dir), "--port", str(self.port)]  # fmt: skip
        args += option_flags(self.options)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("a")
        self.proc = subprocess.Popen(args, env=self.env, stdout=self._log_file, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until_answering(self.url + Route.HEALTH, self.proc, timeout, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """kill -9: no shutdown handler runs."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close_log()

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def rss_mb(self, field: str = "VmHWM") -> float:
        """The child's memory from /proc: VmHWM its peak resident set so far, VmRSS the current one."""
        if self.proc is None:
            raise RuntimeError("not started")
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {field} in /proc/{self.proc.pid}/status")

    def metric(self, name: str) -> float:
        """One unlabelled sample of the server's ``/metrics`` (:func:`metric_sample`)."""
        return metric_sample(httpx.get(self.url + METRICS_PATH, timeout=10).text, name)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
