"""The personal classifier on top of the base: a softmax layer, or an ordinal head for ratings.

Both output one value per class whose argmax is the prediction and whose cross-entropy is the
loss, so the training program, ONNX's ``logits``, the protocol and the phone do not depend on
the head. The ordinal head's outputs are normalized log-probabilities (cross-entropy's
log-softmax leaves them unchanged).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from fedper.common.errors import ConfigError

HeadKind = Literal["softmax", "ordinal"]
HEADS: tuple[HeadKind, ...] = get_args(HeadKind)


class OrdinalHead(nn.Module):
    """A cumulative-link (ordered logit) head: one score per photo and K-1 ordered cut points,
    P(rating <= k) = sigmoid(cut_k - score), returned as K log class-probabilities.

    Ratings are ordered; a softmax layer learns each of the K classes apart (K x d weights from
    a user's few hundred photos), this learns one direction and where the user's cuts are
    (d + K - 1). Cut points are ``first`` plus a running sum of softplus gaps, so they stay
    ordered under any update; the log-probabilities are computed without subtracting sigmoids,
    so they stay finite in float32.
    """

    def __init__(self, features: int, num_classes: int):
        super().__init__()
        self.score = nn.Linear(features, 1, bias=False)
        # Cut points start at the logistic quantiles of equal class frequencies.
        cuts = torch.logit(torch.arange(1, num_classes, dtype=torch.float32) / num_classes)
        self.first = nn.Parameter(cuts[:1].clone())
        self.gaps = nn.Parameter(torch.log(torch.expm1(cuts[1:] - cuts[:-1])))  # softplus^-1
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gaps = F.softplus(self.gaps)
        cuts = torch.cat([self.first, self.first + torch.cumsum(gaps, 0)])
        a = cuts[None, :] - self.score(x)  # the logit of P(y <= k)
        # log(sigmoid(a_k) - sigmoid(a_{k-1})) = logsig(a_k) + logsig(-a_{k-1}) + log(1 - e^-gap_k),
        # and with gap = softplus(t), 1 - e^-gap = sigmoid(t): no expm1 (which ONNX lacks).
        middle = F.logsigmoid(a[:, 1:]) + F.logsigmoid(-a[:, :-1]) + F.logsigmoid(self.gaps)[None, :]
        return torch.cat([F.logsigmoid(a[:, :1]), middle, F.logsigmoid(-a[:, -1:])], 1)


def rating_prior(head: nn.Module, labels: torch.Tensor, num_classes: int) -> dict[str, torch.Tensor]:
    """The tensors (named within ``head``) that make a fresh head predict its user's rating
    frequencies whatever the features, with every class possible (add-one counts).

    A fresh head with random weights predicts noise (below chance) and a few dozen SGD steps do
    not undo it; started here, it predicts the user's most frequent rating and training moves
    it from there. The usual start of a cumulative-link model's cut points; it uses only the
    user's own ratings, on the user's device.
    """
    if labels.ndim != 1 or (len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes):
        raise ConfigError(f"ratings must be a 1-d tensor of classes 0..{num_classes - 1}")
    counts = torch.bincount(labels.long(), minlength=num_classes).double()
    p = (counts + 1) / (counts.sum() + num_classes)
    if isinstance(head, OrdinalHead):
        cuts = torch.logit(torch.cumsum(p, 0)[:-1])
        return {
            "score.weight": torch.zeros_like(head.score.weight),
            "first": cuts[:1].float(),
            "gaps": torch.log(torch.expm1(cuts[1:] - cuts[:-1])).float(),  # softplus^-1
        }
    if isinstance(head, nn.Linear) and head.bias is not None:
        return {"weight": torch.zeros_like(head.weight), "bias": torch.log(p).float()}
    raise ConfigError(f"no rating prior for a head of type {type(head).__name__}")


def classifier(kind: str, features: int, num_classes: int) -> nn.Module:
    """The head named ``kind`` from ``features`` pooled features to ``num_classes`` outputs."""
    if kind == "softmax":
        return nn.Linear(features, num_classes)
    if kind == "ordinal":
        if num_classes < 2:
            raise ConfigError(f"the ordinal head needs at least 2 ordered classes, got {num_classes}")
        return OrdinalHead(features, num_classes)
    raise ConfigError(f"unknown head {kind!r}; choose one of: {', '.join(HEADS)}")
