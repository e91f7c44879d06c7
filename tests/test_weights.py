import numpy as np
import pytest

from fedper import weights
from fedper.atomic_write import atomic_directory

LAYOUT = [("a.weight", (2, 3)), ("b.bias", (4,))]


def _tensors():
    return {
        "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b.bias": np.ones(4, np.float32),
    }


def test_round_trip_keeps_names_values_and_metadata(tmp_path):
    path = tmp_path / "w.safetensors"
    weights.save(path, _tensors(), {"kind": "base"})
    back = weights.load(path)
    assert set(back) == {"a.weight", "b.bias"}
    np.testing.assert_array_equal(back["a.weight"], _tensors()["a.weight"])
    assert not list(tmp_path.glob(".*tmp"))  # no temporary left behind


def test_split_files_merge_and_are_checked(tmp_path):
    t = _tensors()
    weights.save(tmp_path / "base.safetensors", {"a.weight": t["a.weight"]})
    weights.save(tmp_path / "head.safetensors", {"b.bias": t["b.bias"]})
    merged = weights.load_checked([tmp_path / "base.safetensors", tmp_path / "head.safetensors"], LAYOUT)
    assert list(merged) == ["a.weight", "b.bias"]


def test_layout_errors_name_the_file_and_tensor(tmp_path):
    p = tmp_path / "w.safetensors"
    weights.save(p, {"a.weight": np.zeros((3, 2), np.float32), "b.bias": np.zeros(4, np.float32)})
    with pytest.raises(
        weights.WeightsError,
        match=r"w.safetensors: tensor 'a.weight' has shape \[3, 2\], expected \[2, 3\]",
    ):
        weights.load_checked([p], LAYOUT)
    weights.save(p, {"a.weight": np.zeros((2, 3), np.float32)})
    with pytest.raises(weights.WeightsError, match="missing 1 tensor.*b.bias"):
        weights.load_checked([p], LAYOUT)
    weights.save(p, {**_tensors(), "zzz": np.zeros(1, np.float32)})
    with pytest.raises(weights.WeightsError, match="unexpected tensor 'zzz'"):
        weights.load_checked([p], LAYOUT)
    q = tmp_path / "dup.safetensors"
    weights.save(q, {"b.bias": np.zeros(4, np.float32)})
    weights.save(p, _tensors())
    with pytest.raises(weights.WeightsError, match="'b.bias' appears in both"):
        weights.load_checked([p, q], LAYOUT)
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{not")
    with pytest.raises(weights.WeightsError, match="junk.safetensors is not a valid safetensors file"):
        weights.load(tmp_path / "junk.safetensors")
    weights.save(p, {**_tensors(), "a.weight": np.full((2, 3), np.nan, np.float32)})
    with pytest.raises(weights.WeightsError, match="NaN or Inf"):
        weights.load_checked([p], LAYOUT)


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    with atomic_directory(target) as staging:
        (staging / "ok.bin").write_bytes(b"1")
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "new.bin").write_bytes(b"2")
        raise RuntimeError("boom")
    assert [p.name for p in target.iterdir()] == ["ok.bin"]  # the previous version survives
