"""Baselines on a run's own split: exact on data with a known answer, and in every result."""

from __future__ import annotations

import numpy as np
import pytest

from fedper.baselines import per_client_accuracy
from fedper.data import DataConfig, load_federated
from fedper.data.dataset import DatasetError, ImageDataset
from fedper.data.partition import ClientIndices
from fedper.data.registry import FederatedData


def _data(labels: list[int], splits: list[tuple[list[int], list[int]]], features: np.ndarray | None) -> FederatedData:
    n = len(labels)
    dataset = ImageDataset("toy", np.zeros((n, 4, 4, 3), np.uint8), np.array(labels), ("a", "b", "c"),
                           features=features)  # fmt: skip
    clients = tuple(ClientIndices(np.array(tr), np.array(te)) for tr, te in splits)
    return FederatedData(dataset, clients, "toy")


def test_majority_is_each_clients_own_most_common_label():
    #           client 0: train 0 0 1, test 0 1   | client 1: train 2 2 0, test 2 2 1 0
    labels = [0, 0, 1, 0, 1, 2, 2, 0, 2, 2, 1, 0]
    data = _data(labels, [([0, 1, 2], [3, 4]), ([5, 6, 7], [8, 9, 10, 11])], None)
    assert per_client_accuracy(data) == {"majority": [0.5, 0.5]}  # no features: no feature baselines


def test_feature_baselines_find_a_personal_rule_one_global_model_cannot():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 2))
    # Client 0 rates by the first feature, client 1 by its opposite: personal tastes that disagree.
    labels = np.concatenate([(x[:200, 0] > 0).astype(int), (x[200:, 0] < 0).astype(int)])
    splits = [(list(range(0, 150)), list(range(150, 200))), (list(range(200, 350)), list(range(350, 400)))]
    result = per_client_accuracy(_data(labels.tolist(), splits, x))
    assert min(result["per_client_features"]) > 0.9
    assert np.mean(result["pooled_features"]) < 0.75
    assert max(result["majority"]) < 0.75


def test_aesthetic_synth_carries_the_generators_features_into_every_split():
    data = load_federated(DataConfig(dataset="aesthetic-synth", partition="user", users=4, num_clients=4,
                                     images_per_user=(60, 60), seed=0))  # fmt: skip
    train = data.client_train(0)
    assert train.features is not None and train.features.shape[0] == len(train)
    first = per_client_accuracy(data)
    assert first == per_client_accuracy(data)  # deterministic
    assert set(first) == {"majority", "per_client_features", "pooled_features"}
    assert np.mean(first["per_client_features"]) > np.mean(first["majority"])


def test_features_must_match_the_samples():
    with pytest.raises(DatasetError, match="features"):
        ImageDataset("toy", np.zeros((3, 4, 4, 3), np.uint8), np.zeros(3, np.int64), ("a",), features=np.zeros((2, 5)))
