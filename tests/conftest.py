"""Shared fixtures: real exports (ExecuTorch + ONNX), made once per session in the background."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedper.common.manifest import Manifest, read_manifest
from fedper.data import DataConfig, load_dataset, to_tensor
from tests.support.numeric_claims import NumericClaims

_session_threads = 0  # torch's thread count for every test, set at configure


def pytest_configure(config: pytest.Config) -> None:
    """``FEDPER_TEST_THREADS`` (set by ``make test-portable``): torch's and ExecuTorch's thread
    count for this run, set before any program is loaded."""
    global _session_threads
    threads = os.environ.get("FEDPER_TEST_THREADS")
    if threads:
        from fedper.device_runtime.compute_threads import set_compute_threads

        set_compute_threads(int(threads))
    _session_threads = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _session_thread_count() -> Iterator[None]:
    """Each test computes with the session's thread count: a simulation run in process sets
    torch's to its ``--threads``, which would otherwise hold for every later test."""
    torch.set_num_threads(_session_threads)
    yield
    torch.set_num_threads(_session_threads)


class BackgroundExport:
    """``fedper export`` (the command line, with its check by the device runtime) in a child
    process: an export is 1-2 minutes of single-threaded tracing, so it runs on one core while
    the tests that need no export run first on the other."""

    def __init__(self, out: Path, variant: str) -> None:
        self.out, self.variant, self.log = out, variant, out.parent / f"export-{variant}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def _done(self) -> Path:
        """Written once the export succeeded: what a later run with FEDPER_TEST_EXPORTS reuses."""
        return self.out.parent / "exported"

    def start(self) -> BackgroundExport:
        if self.proc is None and not self._done.exists():
            self.out.parent.mkdir(parents=True, exist_ok=True)
            args = [sys.executable, "-m", "fedper.cli", "export", "--out", str(self.out), "--kp", "2",
                    "--dataset", "digits", "--seed", "0", "--variant", self.variant]  # fmt: skip
            with self.log.open("w") as log:
                self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        return self

    def result(self) -> Path:
        if not self._done.exists():
            if self.start().proc.wait() != 0:  # type: ignore[union-attr]
                raise RuntimeError(f"the test export failed:\n{self.log.read_text()[-3000:]}")
            self._done.touch()
        return self.out


# fixture name -> the training-graph variant it exports
EXPORT_FIXTURES = {"artifacts": "fast", "plain_artifacts": "plain"}
_exports: dict[str, BackgroundExport] = {}
# FEDPER_TEST_EXPORTS=DIR keeps the exports in DIR for the next run to reuse: make test-portable
# exports once per kernel set (an export's initial weights depend on it) for every thread count.
_kept_exports = os.environ.get("FEDPER_TEST_EXPORTS")
_export_root = Path(_kept_exports) if _kept_exports else Path(tempfile.mkdtemp(prefix="fedper-test-exports-"))
# The tests' exports lower their programs: a cache of the user's (~/.cache) must not answer them.
os.environ["FEDPER_CACHE_DIR"] = str(_export_root / "export-cache")


def needs(item: pytest.Item) -> set[str]:
    """The variants an item's fixtures (or its ``export_fixture`` parameter) export."""
    callspec = getattr(item, "callspec", None)
    names = [*getattr(item, "fixturenames", ()), callspec.params.get("export_fixture") if callspec else None]
    return {EXPORT_FIXTURES[f] for f in names if f in EXPORT_FIXTURES}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marker ``export`` on each test that needs a real export, so that ``-m "not export"``
    (``make test-fast``) can leave those minutes out; ``slow`` too on each that needs the plain
    training graph's, a second export kept only for comparison (``make test-slow``)."""
    variants = needs(item)
    if variants:
        item.add_marker(pytest.mark.export)
    if "plain" in variants:
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the export the selected tests need first, and order the tests: those that need no
    export, then those that need the default one, then those that need the plain one (exported
    once the default one is done, so that the two do not compete for the free core)."""
    for variant in sorted(set().union(*(needs(item) for item in items))):
        _exports[variant] = BackgroundExport(_export_root / variant / "artifacts", variant)
    if _exports and not config.option.collectonly:
        _exports.get("fast", _exports.get("plain")).start()  # type: ignore[union-attr]
    items.sort(key=lambda item: (bool(needs(item)), "plain" in needs(item)))  # stable within groups


def pytest_sessionfinish(session: pytest.Session) -> None:
    for export in _exports.values():
        if export.proc is not None and export.proc.poll() is None:
            export.proc.kill()
            export.proc.wait()
    if not _kept_exports:
        shutil.rmtree(_export_root, ignore_errors=True)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """MobileNet-V1 width 0.25, 32x32, 10 classes (digits), kp=2, the default (fast) training
    graph: exported once for the session, in the background."""
    out = _exports["fast"].result()
    if "plain" in _exports:
        _exports["plain"].start()
    return out


@pytest.fixture(scope="session")
def plain_artifacts() -> Path:
    """The same export with the plain (nn.Conv2d) training graph, kept for comparison."""
    return _exports["plain"].result()


@pytest.fixture(scope="session")
def server_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the server needs of an export (the real manifest and weights of MobileNet-V1 width
    0.25, placeholder program files it serves as opaque bytes), in a second, not minutes."""
    from fedper.export.pipeline import write_server_only_export

    return write_server_only_export(tmp_path_factory.mktemp("server-export") / "artifacts", alpha=0.25)


@pytest.fixture
def claim(record_property: Callable[[str, object], None]) -> NumericClaims:
    """Assert a numeric test's value against its bound and record both (tests/support/portable.py)."""
    return NumericClaims(record_property)


@pytest.fixture(scope="session")
def digits_batches() -> tuple[torch.Tensor, torch.Tensor]:
    """Real images (scikit-learn's digits), normalized as the digits export declares."""
    ds = load_dataset(DataConfig(dataset="digits"))
    x = to_tensor(ds.images[:640], ds.mean, ds.std)
    y = torch.from_numpy(ds.labels[:640])
    return x, y


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Any]:
    """A scratch PostgreSQL cluster for the session (tests/support/postgres.py); the tests that
    need it skip, saying why, where its server binaries are absent."""
    from tests.support import postgres

    reason = postgres.why_not()
    if reason is not None:
        pytest.skip(reason)
    with postgres.cluster() as running:
        yield running


@pytest.fixture(scope="session")
def server_manifest(server_artifacts: Path) -> Manifest:
    return read_manifest(server_artifacts)


@pytest.fixture
def server_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's secrets in the environment, as the in-process server tests open it."""
    from tests.support.server_support import ADMIN, ENROLL

    monkeypatch.setenv("FEDPER_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)
