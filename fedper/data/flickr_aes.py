"""FLICKR-AES (Ren et al., 2017) from its released layout on a local directory.

Layout: ``FLICKR-AES_image_labeled_by_each_worker.csv`` (header ``worker,
imagePair, score`` with spaces after the commas) and the ``40K/`` image folder.
Worker selection follows the FedPer paper / Flower baseline: workers with 60-290
ratings whose ratings contain every score 1-5 at least 4 times; ``num_workers``
of them are drawn with the seed. Scores 1-5 become classes 0-4.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedper.data.dataset import DatasetError, ImageDataset
from fedper.data.imaging import read_photo

RATINGS_CSV = "FLICKR-AES_image_labeled_by_each_worker.csv"
IMAGE_DIR = "40K"
MIN_RATINGS, MAX_RATINGS, MIN_PER_SCORE = 60, 290, 4
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's
CLASSES = ("1", "2", "3", "4", "5")


def read_ratings(path: Path) -> dict[str, list[tuple[str, int]]]:
    """worker -> [(image file, score 1-5)], in file order."""
    by_worker: dict[str, list[tuple[str, int]]] = defaultdict(list)
    try:
        f = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from exc
    with f:
        reader = csv.reader(f, skipinitialspace=True)
        header = [h.strip() for h in next(reader, [])]
        if header[:3] != ["worker", "imagePair", "score"]:
            raise DatasetError(f"{path}: header is {header}, expected worker, imagePair, score")
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise DatasetError(f"{path}:{line_no}: expected 3 columns, got {len(row)}")
            worker, image, score_text = (c.strip() for c in row[:3])
            try:
                score = int(float(score_text))
            except ValueError as exc:
                raise DatasetError(f"{path}:{line_no}: score {score_text!r} is not a number") from exc
            if not 1 <= score <= 5:
                raise DatasetError(f"{path}:{line_no}: score {score} outside 1..5")
            by_worker[worker].append((image, score))
    return dict(by_worker)


def eligible_workers(ratings: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Workers the paper's selection keeps, sorted for determinism."""
    keep = []
    for worker, rows in ratings.items():
        if not MIN_RATINGS <= len(rows) <= MAX_RATINGS:
            continue
        counts = np.bincount([s for _, s in rows], minlength=6)[1:]
        if (counts >= MIN_PER_SCORE).all():
            keep.append(worker)
    return sorted(keep)


def load(root: Path, num_workers: int, seed: int, image_size: int) -> ImageDataset:
    root = Path(root)
    ratings = read_ratings(root / RATINGS_CSV)
    eligible = eligible_workers(ratings)
    if len(eligible) < num_workers:
        raise DatasetError(
            f"{root / RATINGS_CSV}: only {len(eligible)} workers have {MIN_RATINGS}-{MAX_RATINGS} "
            f"ratings with every score at least {MIN_PER_SCORE} times; {num_workers} requested"
        )
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(eligible, size=num_workers, replace=False).tolist())
    images, labels, groups = [], [], []
    for gid, worker in enumerate(chosen):
        for name, score in ratings[worker]:
            images.append(read_photo(root / IMAGE_DIR / name, image_size, "FLICKR-AES image"))
            labels.append(score - 1)
            groups.append(gid)
    return ImageDataset(
        name="flickr-aes",
        images=np.stack(images),
        labels=np.asarray(labels, dtype=np.int64),
        classes=CLASSES,
        groups=np.asarray(groups, dtype=np.int64),
        mean=MEAN,
        std=STD,
        info={"workers": chosen},
    )
