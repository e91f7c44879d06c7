"""A scratch PostgreSQL cluster for the tests and the benchmarks: Debian's server binaries
(``make test`` installs the ``postgresql`` package if they are missing), ``initdb`` into a
temporary directory, listening on a free loopback port, one empty database per test.

Postgres refuses to run as root: as root, the cluster runs as the ``postgres`` user the
package creates (``runuser``)."""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from fedper.server.process import free_port

USER = "fedper"


def server_binaries() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on the PATH, else Debian's newest
    /usr/lib/postgresql/N/bin; None if PostgreSQL is not installed."""
    found = shutil.which("pg_ctl")
    if found is not None and shutil.which("initdb") is not None:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def why_not() -> str | None:
    """Why no cluster can be started here (None: one can)."""
    if server_binaries() is None:
        return "no PostgreSQL server binaries (make test installs Debian's postgresql package)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the cluster as"
    return None


def _as_owner(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Cluster:
    """One running cluster; :meth:`database` makes an empty database and gives its URL."""

    def __init__(self, root: Path) -> None:
        binaries = server_binaries()
        assert binaries is not None, why_not()
        self.root, self.data, self.port = root, root / "data", free_port()
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(root, owner.pw_uid, owner.pw_gid)
        subprocess.run(_as_owner([str(binaries / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
                                  "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)  # fmt: skip
        options = (f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")  # fmt: skip
        done = subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(self.data), "-l", str(root / "log"),
                                         "-o", options, "-w", "start"]), capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            log = (root / "log").read_text() if (root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {done.stdout}{done.stderr}\n{log[-2000:]}")
        self._binaries = binaries

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def database(self) -> str:
        """A new empty database's URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(_as_owner([str(self._binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
                       capture_output=True)  # fmt: skip


@contextlib.contextmanager
def cluster(root: Path | None = None) -> Iterator[Cluster]:
    """A cluster stopped on exit; in a temporary directory, or in ``root`` (kept, with its log)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fedper-pg-")))
        root.mkdir(parents=True, exist_ok=True)
        running = Cluster(root)
        try:
            yield running
        finally:
            running.stop()


_shared: Cluster | None = None
_shared_dir: tempfile.TemporaryDirectory[str] | None = None
_by_data_dir: dict[Path, str] = {}


def database_for(data_dir: Path) -> str:
    """The database of a test server's data directory, on one cluster shared by the session
    (started on first use, stopped at exit): the same directory gets the same database, so a
    test that restarts its server finds its records (``FEDPER_TEST_DATABASE=postgres``)."""
    global _shared, _shared_dir
    if _shared is None:
        reason = why_not()
        if reason is not None:
            raise RuntimeError(f"FEDPER_TEST_DATABASE=postgres: {reason}")
        _shared_dir = tempfile.TemporaryDirectory(prefix="fedper-pg-")
        _shared = Cluster(Path(_shared_dir.name))
        atexit.register(_stop_shared)
    key = Path(data_dir).resolve()
    if key not in _by_data_dir:
        _by_data_dir[key] = _shared.database()
    return _by_data_dir[key]


def _stop_shared() -> None:
    if _shared is not None:
        _shared.stop()
    if _shared_dir is not None:
        _shared_dir.cleanup()
