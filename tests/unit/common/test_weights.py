import io
import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from fedper.common import weights
from fedper.common.atomic_write import atomic_directory

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


# --- the streaming writer: byte for byte what the library writes -----------------------

_NAMES = st.text(st.characters(codec="utf-8"), max_size=12).filter(lambda s: s != "__metadata__")
_SHAPES = st.lists(st.integers(0, 5), max_size=4).map(tuple)  # scalars and zero-size dims included
_DTYPES = st.sampled_from([np.float32, np.float16, np.float64, np.int8, np.uint8, np.int64, np.bool_])


@st.composite
def _tensor_dicts(draw, dtypes=_DTYPES):
    names = draw(st.lists(_NAMES, max_size=8, unique=True))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    out = {}
    for name in names:
        shape = draw(_SHAPES)
        out[name] = np.asarray(rng.standard_normal(shape) * 100).astype(draw(dtypes))
    return out


def _written(tensors, metadata=None) -> bytes:
    buffer = io.BytesIO()
    count = weights.write_to(buffer, tensors, metadata)
    assert count == len(buffer.getvalue())
    return buffer.getvalue()


@settings(max_examples=400, deadline=None)
@given(
    _tensor_dicts(),
    st.one_of(st.none(), st.dictionaries(_NAMES, st.text(st.characters(codec="utf-8"), max_size=20), max_size=1)),
)
def test_write_to_is_byte_identical_to_the_library(tensors, metadata):
    assume(tensors or metadata != {})  # the one case the library gets wrong, tested below
    assert _written(tensors, metadata) == st_save(tensors, metadata)


def test_no_tensors_and_empty_metadata_give_a_valid_header():
    # safetensors 0.8 writes '{},"__metadata__":{}}' here, which it cannot load itself.
    assert st_load(_written({}, {})) == {}


@settings(max_examples=100, deadline=None)
@given(_tensor_dicts(), st.dictionaries(_NAMES, st.text(max_size=10), min_size=2, max_size=6))
def test_several_metadata_keys_differ_from_the_library_only_in_their_order(tensors, metadata):
    # The library keeps metadata in a hash map, so with several keys its own output varies
    # from one process to the next; write_to keeps the mapping's order.
    ours, theirs = _written(tensors, metadata), st_save(tensors, metadata)
    assert len(ours) == len(theirs) and ours[:8] == theirs[:8]
    n = int.from_bytes(ours[:8], "little")
    assert ours[8 + n :] == theirs[8 + n :]
    ours_header, theirs_header = json.loads(ours[8 : 8 + n]), json.loads(theirs[8 : 8 + n])
    assert list(ours_header) == list(theirs_header)  # same tensor order, metadata first
    assert ours_header == theirs_header
    assert list(ours_header["__metadata__"]) == list(metadata)


@settings(max_examples=200, deadline=None)
@given(_tensor_dicts(st.sampled_from([np.float32, np.float16])))
def test_the_library_loads_what_write_to_wrote(tensors):
    back = st_load(_written(tensors, {"kind": "update"}))
    assert set(back) == set(tensors)
    for name, arr in tensors.items():
        assert back[name].dtype == arr.dtype and back[name].shape == arr.shape
        np.testing.assert_array_equal(back[name], arr)


def test_write_to_handles_views_big_endian_and_read_only_buffers(tmp_path):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    tensors = {
        "strided": base[:, ::2],  # not contiguous
        "big": base.astype(">f4"),
        "ro": np.frombuffer(base.tobytes(), np.float32),
        "scalar": np.array(3.5, np.float16),
    }
    expected = st_save({k: np.asarray(v, v.dtype.newbyteorder("="), order="C") for k, v in tensors.items()}, None)
    assert _written(tensors) == expected
    with open(tmp_path / "unbuffered.safetensors", "wb", buffering=0) as f:
        weights.write_to(f, tensors)
    assert (tmp_path / "unbuffered.safetensors").read_bytes() == expected
    with pytest.raises(ValueError, match="cannot be stored"):
        weights.write_to(io.BytesIO(), {"x": np.zeros(2, np.complex128)})


def test_save_and_encode_write_what_the_library_would(tmp_path):
    tensors = {"b": np.ones((2, 2), np.float16), "a": np.arange(3, dtype=np.float64)}
    as_float32 = {k: v.astype(np.float32) for k, v in tensors.items()}
    weights.save(tmp_path / "w.safetensors", tensors, {"kind": "base"})
    assert (tmp_path / "w.safetensors").read_bytes() == st_save(as_float32, {"kind": "base"})
    assert weights.encode(tensors) == st_save(as_float32)
    assert weights.encode(tensors, {}, dtype=None) == st_save(tensors)  # empty metadata: none


def test_a_failed_save_leaves_the_previous_file(tmp_path):
    path = tmp_path / "w.safetensors"
    weights.save(path, _tensors())
    before = path.read_bytes()
    with pytest.raises(ValueError):
        weights.save(path, {**_tensors(), "__metadata__": np.zeros(1, np.float32)})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
