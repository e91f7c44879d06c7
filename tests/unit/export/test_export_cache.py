"""The export cache: keys that change with everything that determines the programs, entries
that are copied only when intact."""

from __future__ import annotations

import json

import pytest
import torch

from fedper.export.export_cache import ENTRY_FILE, ExportCache, program_key
from fedper.models import ModelConfig, build_model

NAMES = ("train.pte", "train.ptd")


def _files(directory, content: bytes):
    directory.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(NAMES):
        (directory / name).write_bytes(content + bytes([i]))
    return directory


def test_the_key_changes_with_the_model_the_weights_and_the_batch_only():
    config = ModelConfig(num_classes=10)
    model = build_model(config, seed=0)
    state = model.state_dict()
    key = program_key(config, "fast", 64, state)
    assert program_key(config, "fast", 64, build_model(config, seed=0).state_dict()) == key
    assert program_key(config, "plain", 64, state) != key
    assert program_key(config, "fast", 32, state) != key
    assert program_key(ModelConfig(num_classes=11), "fast", 64, state) != key
    nudged = {name: t.clone() for name, t in state.items()}
    first = next(name for name, t in nudged.items() if t.is_floating_point())
    nudged[first].view(-1)[0] = torch.nextafter(nudged[first].view(-1)[0], torch.tensor(1.0))
    assert program_key(config, "fast", 64, nudged) != key


def test_a_stored_entry_is_fetched_byte_for_byte(tmp_path):
    cache = ExportCache(tmp_path / "cache")
    cache.store("k", _files(tmp_path / "made", b"program"), NAMES)
    into = tmp_path / "into"
    into.mkdir()
    assert cache.fetch("k", into, NAMES)
    for name in NAMES:
        assert (into / name).read_bytes() == (tmp_path / "made" / name).read_bytes()
    assert not cache.fetch("other", into, NAMES)


@pytest.mark.parametrize("damage", ["flip a byte", "remove a file", "garble the entry", "other files"])
def test_a_damaged_entry_is_a_miss_and_is_dropped(tmp_path, damage):
    cache = ExportCache(tmp_path / "cache")
    cache.store("k", _files(tmp_path / "made", b"program"), NAMES)
    entry = tmp_path / "cache" / "k"
    if damage == "flip a byte":
        data = bytearray((entry / NAMES[0]).read_bytes())
        data[0] ^= 1
        (entry / NAMES[0]).write_bytes(bytes(data))
    elif damage == "remove a file":
        (entry / NAMES[1]).unlink()
    elif damage == "garble the entry":
        (entry / ENTRY_FILE).write_text("{not json")
    else:
        (entry / ENTRY_FILE).write_text(json.dumps({"files": {"x": "0"}}))
    into = tmp_path / "into"
    into.mkdir()
    assert not cache.fetch("k", into, NAMES)
    assert not entry.exists()


def test_only_the_most_recently_used_entries_are_kept(tmp_path):
    import os

    cache = ExportCache(tmp_path / "cache", keep=2)
    keys = [c * 64 for c in "abcd"]
    (tmp_path / "cache" / "the user's own").mkdir(parents=True)  # --cache may name a shared directory
    os.utime(tmp_path / "cache" / "the user's own", (1, 1))
    for i, key in enumerate(keys[:3]):
        cache.store(key, _files(tmp_path / f"made{i}", key.encode()), NAMES)
        os.utime(tmp_path / "cache" / key, (1000 + i, 1000 + i))
    cache.store(keys[3], _files(tmp_path / "made3", b"d"), NAMES)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([*keys[2:], "the user's own"])
