"""Shared fixtures: one real export (ExecuTorch + ONNX) for the whole test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from device_runtime.training_program import check_exported
from export.pipeline import ExportConfig, ExportReport, run_export
from fedper.data import DataConfig, load_dataset, to_tensor
from fedper.manifest import Manifest, read_manifest


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> ExportReport:
    """MobileNet-V1 width 0.25, 32x32, 10 classes, kp=2, the default (fast) training graph:
    exported once for the session (~70 s)."""
    out = tmp_path_factory.mktemp("export") / "artifacts"
    return run_export(ExportConfig(out=out, kp=2, dataset="digits", seed=0), check=check_exported)


@pytest.fixture(scope="session")
def plain_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same export with the plain (nn.Conv2d) training graph, kept for comparison."""
    out = tmp_path_factory.mktemp("export-plain") / "artifacts"
    return run_export(ExportConfig(out=out, kp=2, dataset="digits", seed=0, variant="plain"), check=check_exported).out


@pytest.fixture(scope="session")
def artifacts(exported: ExportReport) -> Path:
    return exported.out


@pytest.fixture(scope="session")
def server_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the server needs of an export (the real manifest and weights of MobileNet-V1 width
    0.25, placeholder program files it serves as opaque bytes), in a second, not minutes."""
    from export.pipeline import write_server_only_export

    return write_server_only_export(tmp_path_factory.mktemp("server-export") / "artifacts", alpha=0.25)


@pytest.fixture(scope="session")
def digits_batches() -> tuple[torch.Tensor, torch.Tensor]:
    """Real images (scikit-learn's digits), normalized as the digits export declares."""
    ds = load_dataset(DataConfig(dataset="digits"))
    x = to_tensor(ds.images[:640], ds.mean, ds.std)
    y = torch.from_numpy(ds.labels[:640])
    return x, y


@pytest.fixture(scope="session")
def server_manifest(server_artifacts: Path) -> Manifest:
    return read_manifest(server_artifacts)
