import numpy as np
import pytest

from fedper.data import DataConfig, DatasetError, ImageDataset, partition
from fedper.data.partition import by_user, classes_per_client, dirichlet, iid, train_test


def _labels(n_classes=10, per_class=50):
    return np.repeat(np.arange(n_classes), per_class)


def _assert_disjoint(parts, total=None):
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist()))
    if total is not None:
        assert sorted(allidx.tolist()) == list(range(total))


def test_classes_per_client_gives_k_classes_split_evenly():
    labels = _labels()
    parts = classes_per_client(labels, 20, 4, np.random.default_rng(0))
    _assert_disjoint(parts)
    for p in parts:
        assert len(np.unique(labels[p])) == 4
    # A class's samples are shared evenly among the clients that drew it.
    for c in range(10):
        owners = [len(np.intersect1d(p, np.flatnonzero(labels == c))) for p in parts]
        owners = [o for o in owners if o]
        if owners:
            assert max(owners) - min(owners) <= 1
            assert sum(owners) == 50


def test_k_equal_to_all_classes_covers_everything():
    labels = _labels()
    parts = classes_per_client(labels, 5, 10, np.random.default_rng(0))
    _assert_disjoint(parts, total=len(labels))
    assert all(len(np.unique(labels[p])) == 10 for p in parts)


def test_partitioners_are_deterministic():
    labels = _labels()
    for fn in (
        lambda r: classes_per_client(labels, 10, 3, r),
        lambda r: dirichlet(labels, 10, 0.3, r),
        lambda r: iid(len(labels), 10, r),
    ):
        a, b, c = (
            fn(np.random.default_rng(7)),
            fn(np.random.default_rng(7)),
            fn(np.random.default_rng(8)),
        )
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_covers_everything_and_small_alpha_is_skewed():
    labels = _labels()
    parts = dirichlet(labels, 10, 0.1, np.random.default_rng(0))
    _assert_disjoint(parts, total=len(labels))
    dominant = [np.bincount(labels[p], minlength=10).max() / max(1, len(p)) for p in parts if len(p)]
    assert np.mean(dominant) > 0.5
    iid_parts = dirichlet(labels, 10, 1000.0, np.random.default_rng(0))
    dominant_iid = [np.bincount(labels[p], minlength=10).max() / len(p) for p in iid_parts]
    assert np.mean(dominant_iid) < 0.25


def test_iid_shares_are_equal_and_complete():
    parts = iid(101, 10, np.random.default_rng(0))
    _assert_disjoint(parts, total=101)
    assert {len(p) for p in parts} <= {10, 11}


def test_by_user_gives_each_client_one_user():
    groups = np.repeat(np.arange(6), [5, 6, 7, 8, 9, 10])
    parts = by_user(groups, 4, np.random.default_rng(0))
    _assert_disjoint(parts)
    for p in parts:
        assert len(np.unique(groups[p])) == 1
        assert len(p) == int((groups == groups[p[0]]).sum())
    with pytest.raises(DatasetError, match="7 clients requested but the dataset has 6 users"):
        by_user(groups, 7, np.random.default_rng(0))


def test_train_test_split_is_disjoint_and_complete():
    idx = np.arange(100, 150)
    s = train_test(idx, 0.2, np.random.default_rng(0))
    assert len(s.test) == 10 and len(s.train) == 40
    assert sorted(np.concatenate([s.train, s.test]).tolist()) == idx.tolist()


def test_bad_partition_options_are_clear_errors():
    labels = _labels()
    with pytest.raises(DatasetError, match="classes per client must be in 1..10"):
        classes_per_client(labels, 10, 11, np.random.default_rng(0))
    with pytest.raises(DatasetError, match="alpha must be positive"):
        dirichlet(labels, 10, 0.0, np.random.default_rng(0))
    with pytest.raises(DatasetError, match="cannot be shared among"):
        iid(10, 6, np.random.default_rng(0))


def test_partition_of_a_dataset_gives_each_client_local_train_and_test():
    labels = _labels(per_class=20)
    ds = ImageDataset("t", np.zeros((len(labels), 4, 4, 3), np.uint8), labels, tuple("abcdefghij"))
    fed = partition(ds, DataConfig(num_clients=8, classes_per_client=2, seed=3))
    assert fed.partition == "classes"
    for i, c in enumerate(fed.clients):
        assert not set(c.train.tolist()) & set(c.test.tolist())
        assert set(fed.client_test(i).labels.tolist()) <= set(fed.client_train(i).labels.tolist()) | set(
            labels[c.test].tolist()
        )
        assert len(np.unique(labels[np.concatenate([c.train, c.test])])) == 2
