"""Unrated photos and what they show: the data ``fedper pretrain`` teaches a base to see with.

Each example is a composite made exactly as aesthetic-synth makes its users' photos (a subject
from the packaged public photographs on a background, with photographic edits), but from a seed
stream no user's photos come from, and with **no rater involved**: no rating, no taste vector,
no user's content mix. The targets are properties of the image itself, as an attribute-labelled
public corpus would provide them (AADB-style, Kong et al., ECCV 2016):

- ``looks`` (10): measured on the rendered pixels and the composite's layout: brightness,
  contrast, colourfulness, warmth, detail, vignetting, subject pop (subject sharper than its
  background), distance of the subject from a rule-of-thirds point, subject size, colour
  harmony of subject and background; standardized with the generator's fixed calibration;
- ``edits`` (11): the edits applied (exposure, contrast, saturation, white balance, subject and
  background blur, subject size and position, vignetting, grain), scaled to [-1, 1];
- ``category`` (8): the subject's content category, drawn uniformly.

Example ``i`` of seed ``s`` is rendered from its own random stream ``[s, PRETEXT_STREAM, i]``:
any range of examples can be rendered alone, in any order, with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedper.data import aesthetic_synth as synth

# Users' photos come from streams [seed, 2, user] and raters from [seed, 1] and [seed, 3]:
# this key keeps the pretext's photos apart from all of them, for every seed.
PRETEXT_STREAM = 9
REGRESSION_TARGETS: tuple[str, ...] = (*(f"look.{n}" for n in synth.LOOKS), *(f"edit.{n}" for n in synth.ATTRIBUTES))
CATEGORIES = synth.CATEGORIES
LOOK_COUNT = len(synth.LOOKS)  # the first targets are the looks, then the edits


@dataclass(frozen=True)
class PretextBatch:
    images: np.ndarray  # (n, size, size, 3) uint8
    targets: np.ndarray  # (n, len(REGRESSION_TARGETS)) float32
    categories: np.ndarray  # (n,) int64, index into CATEGORIES


def render(seed: int, start: int, count: int, image_size: int) -> PretextBatch:
    """Examples ``start .. start + count - 1`` of the pretext data of ``seed``."""
    if count < 0 or start < 0 or image_size < 8:
        raise ValueError(f"need start >= 0, count >= 0 and image_size >= 8, got {start}, {count}, {image_size}")
    ranges = np.array(list(synth.ATTRIBUTES.values()))
    mean, std = synth._looks_scale()
    images = np.empty((count, image_size, image_size, 3), np.uint8)
    targets = np.empty((count, len(REGRESSION_TARGETS)), np.float32)
    categories = np.empty(count, np.int64)
    for k in range(count):
        rng = np.random.default_rng([seed, PRETEXT_STREAM, start + k])
        edits = synth._draw_attributes(rng)
        category = int(rng.integers(len(CATEGORIES)))
        work, mask = synth._render(category, edits, synth.WORK_SIZE, rng)
        looks = (synth.measure_looks(work, mask, edits) - mean) / std
        scaled = (np.array(list(edits.values())) - ranges[:, 0]) / (ranges[:, 1] - ranges[:, 0]) * 2 - 1
        images[k] = synth._resized(work, image_size)
        targets[k] = np.concatenate([looks, scaled])
        categories[k] = category
    return PretextBatch(images, targets, categories)
