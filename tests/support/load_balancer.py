"""A reverse proxy in front of several ``fedper serve`` replicas for the tests: Debian's nginx
(``make test`` installs ``nginx-light`` if it is missing), its configuration and files in a
temporary directory, listening on a free loopback port. It spreads requests round-robin and
passes a request that could not reach a replica (refused connection, 502) on to the next one, as
the deployment in docs/SCALING.md does."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from fedper.server.process import free_port


def why_not() -> str | None:
    """Why no proxy can be started here (None: one can)."""
    return None if nginx_binary() else "no nginx (make test installs Debian's nginx-light)"


def nginx_binary() -> str | None:
    """nginx on PATH, or in /usr/sbin where Debian puts it (not on a non-root PATH)."""
    return shutil.which("nginx", path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")


def configuration(root: Path, port: int, upstreams: list[str]) -> str:
    servers = "\n".join(f"    server {u.removeprefix('http://')} max_fails=1 fail_timeout=1s;" for u in upstreams)
    temp = "\n".join(f"  {kind}_temp_path {root}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                    "scgi"))  # fmt: skip
    user = "user root;\n" if os.geteuid() == 0 else ""  # its workers read the temporary directory
    return f"""{user}worker_processes 1;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log {root}/access.log;
{temp}
  client_max_body_size 256m;
  upstream fedper {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fedper;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_next_upstream error timeout http_502;
      proxy_connect_timeout 2s;
      proxy_read_timeout 300s;
    }}
  }}
}}
"""


class LoadBalancer:
    """nginx in front of ``upstreams`` (``http://127.0.0.1:PORT``); :attr:`url` is its address."""

    def __init__(self, root: Path, upstreams: list[str]) -> None:
        binary = nginx_binary()
        assert binary is not None, why_not()
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "nginx.conf"
        conf.write_text(configuration(root, self.port, upstreams))
        self.proc = subprocess.Popen([binary, "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            try:
                httpx.get(self.url + "/v1/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("nginx did not answer in 20 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> LoadBalancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
