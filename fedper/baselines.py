"""Baselines on the same split as a federated run: what a personal model has to beat.

- ``majority``: each client predicts the label most common in its own training split (ties:
  the lowest label). A model at this level has learned nothing about the images.
- ``per_client_features``: each client's own logistic regression on the generator's
  features of its training photos (what its ratings are a function of): the ceiling a
  personal model could reach with a perfect feature extractor.
- ``pooled_features``: one logistic regression on every client's training features
  together: the best one global model can do with the same perfect features.

The feature baselines exist only for generated data (``ImageDataset.features``). Each is
scored on every client's own test split, as the federated algorithms are.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from fedper.data.registry import FederatedData

DESCRIPTIONS = {
    "majority": "each client's most common training label",
    "per_client_features": "a logistic regression per client on the generator's features (the ceiling)",
    "pooled_features": "one logistic regression on all clients' generator features",
}
Predictor = Callable[[np.ndarray], np.ndarray]


def _majority(labels: np.ndarray) -> Predictor:
    label = int(np.bincount(labels).argmax())
    return lambda x: np.full(len(x), label)


def _logistic(x: np.ndarray, y: np.ndarray, seed: int) -> Predictor:
    if len(np.unique(y)) < 2:
        return _majority(y)
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(max_iter=2000, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(scaler.transform(x), y)
    return lambda features: np.asarray(model.predict(scaler.transform(features)))


def per_client_accuracy(data: FederatedData, seed: int = 0) -> dict[str, list[float]]:
    """Each baseline's accuracy on each client's test split (client order)."""
    clients = range(len(data.clients))
    trains, tests = [data.client_train(c) for c in clients], [data.client_test(c) for c in clients]

    def score(predictors: list[Predictor], inputs: list[np.ndarray]) -> list[float]:
        return [
            float(np.mean(predict(x) == test.labels)) if len(test) else float("nan")
            for predict, x, test in zip(predictors, inputs, tests, strict=True)
        ]

    result = {"majority": score([_majority(t.labels) for t in trains], [t.images for t in tests])}
    train_x = [t.features for t in trains if t.features is not None]
    test_x = [t.features for t in tests if t.features is not None]
    if len(train_x) == len(trains) and len(test_x) == len(tests):
        ys = [t.labels for t in trains]
        result["per_client_features"] = score([_logistic(x, y, seed) for x, y in zip(train_x, ys, strict=True)], test_x)
        pooled = _logistic(np.concatenate(train_x), np.concatenate(ys), seed)
        result["pooled_features"] = score([pooled] * len(tests), test_x)
    return result
