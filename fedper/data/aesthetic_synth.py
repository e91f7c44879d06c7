"""aesthetic-synth: a generated stand-in for FLICKR-AES personal aesthetics.

Raw material is real photographs that ship inside installed packages
(scikit-image's data module, scikit-learn's sample images). Every image is a
crop of one of them with photographic edits: exposure, contrast, saturation,
white balance, sharpness/blur, zoom, off-centre composition, vignetting and
grain. Each user rates their own images 1-5 by what the rendered image shows:

    score_u = (shared_taste + personal_taste_u) . looks(image) + noise

where ``looks`` are properties measured on the final pixels (brightness and how
far it is from a good exposure, contrast, colourfulness, warmth, detail,
vignetting, zoom) plus the photo's content, and the personal taste is stronger
than the shared one, so users disagree: one global model cannot fit everyone,
but the same visual properties (what a shared feature extractor learns) explain
every user's ratings. Everything follows from the seed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import skimage.data
import sklearn.datasets
from PIL import Image, ImageFilter

from fedper.data.dataset import DatasetError, ImageDataset
from fedper.data.imaging import to_rgb_uint8

# (file, package, content category)
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("astronaut.png", "skimage", "people"),
    ("camera.png", "skimage", "people"),
    ("chelsea.png", "skimage", "animal"),
    ("coffee.png", "skimage", "food"),
    ("rocket.jpg", "skimage", "vehicle"),
    ("motorcycle_left.png", "skimage", "vehicle"),
    ("china.jpg", "sklearn", "architecture"),
    ("brick.png", "skimage", "architecture"),
    ("flower.jpg", "sklearn", "nature"),
    ("grass.png", "skimage", "nature"),
    ("hubble_deep_field.jpg", "skimage", "space"),
    ("moon.png", "skimage", "space"),
    ("retina.jpg", "skimage", "abstract"),
    ("ihc.png", "skimage", "abstract"),
    ("gravel.png", "skimage", "abstract"),
    ("coins.png", "skimage", "abstract"),
)
CATEGORIES: tuple[str, ...] = (
    "people", "animal", "food", "vehicle", "architecture", "nature", "space", "abstract",
)  # fmt: skip
# Photographic edits, each drawn uniformly from its range when an image is rendered.
ATTRIBUTES: dict[str, tuple[float, float]] = {
    "exposure": (-1.0, 1.0),  # stops
    "contrast": (0.5, 1.7),
    "saturation": (0.0, 1.8),
    "warmth": (-1.0, 1.0),
    "sharpness": (-1.0, 1.0),  # < 0 blurred, > 0 sharpened
    "zoom": (0.2, 1.0),  # crop side / shorter photo side
    "off_centre": (0.0, 1.0),  # crop centre distance from the photo centre
    "vignette": (0.0, 1.0),
    "grain": (0.0, 1.0),
}
CLASSES = ("1", "2", "3", "4", "5")  # the user's rating
# Score thresholds on each user's standardized score: about 10/22/36/22/10 % per class.
THRESHOLDS = (-1.25, -0.45, 0.45, 1.25)
SHARED_WEIGHT = 0.6  # scale of the taste everybody shares
PERSONAL_WEIGHT = 1.0  # scale of each user's own taste (stronger: users disagree)
NOISE = 0.35  # rating noise, in units of the taste scales


@dataclass(frozen=True)
class SynthConfig:
    users: int = 30
    images_per_user: tuple[int, int] = (100, 200)
    image_size: int = 32
    seed: int = 0


@functools.cache
def _source_photos() -> tuple[np.ndarray, ...]:
    dirs = {
        "skimage": Path(skimage.data.__file__).parent,
        "sklearn": Path(sklearn.datasets.__file__).parent / "images",
    }
    photos = []
    for name, package, _ in SOURCES:
        path = dirs[package] / name
        try:
            with Image.open(path) as im:
                photos.append(to_rgb_uint8(np.asarray(im.convert("RGB"))))
        except OSError as exc:
            raise DatasetError(f"aesthetic-synth needs the bundled photo {path}: {exc}") from exc
    return tuple(photos)


def measure_looks(image: np.ndarray, zoom: float) -> np.ndarray:
    """Visible properties of a rendered uint8 image, before standardization (see LOOKS)."""
    x = image.astype(np.float64) / 255.0
    lum = x @ np.array([0.299, 0.587, 0.114])
    rg = x[..., 0] - x[..., 1]
    yb = (x[..., 0] + x[..., 1]) / 2 - x[..., 2]
    colourful = np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean())
    detail = np.abs(np.diff(lum, axis=0)).mean() + np.abs(np.diff(lum, axis=1)).mean()
    h, w = lum.shape
    centre = lum[h // 4 : h - h // 4, w // 4 : w - w // 4].mean()
    edge = (lum.sum() - centre * (h - 2 * (h // 4)) * (w - 2 * (w // 4))) / max(
        1, lum.size - (h - 2 * (h // 4)) * (w - 2 * (w // 4))
    )
    return np.array(
        [lum.mean(), lum.std(), colourful, (x[..., 0] - x[..., 2]).mean(), detail,
         centre - edge, zoom]
    )  # fmt: skip


LOOKS = ("brightness", "contrast", "colourfulness", "warmth", "detail", "vignetting", "zoom")


@functools.cache
def _looks_scale() -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of each look over a fixed calibration sample (the same for every seed)."""
    rng = np.random.default_rng(20_190_818)
    photos = _source_photos()
    ranges = np.array(list(ATTRIBUTES.values()))
    rows = []
    for _ in range(400):
        attrs = rng.uniform(ranges[:, 0], ranges[:, 1])
        a = dict(zip(ATTRIBUTES, map(float, attrs), strict=True))
        img = _render(photos[int(rng.integers(len(photos)))], a, 32, rng)
        rows.append(measure_looks(img, a["zoom"]))
    m = np.array(rows)
    return m.mean(axis=0), m.std(axis=0) + 1e-9


def _feature_matrix(looks: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """What a taste is linear in: standardized looks, badness of exposure, content one-hot."""
    mean, std = _looks_scale()
    unit = (looks - mean) / std
    extreme = unit[:, :1] ** 2 - 1.0  # too dark or too bright: a non-linear cue
    content = np.zeros((len(looks), len(CATEGORIES)))
    cat_index = {c: i for i, c in enumerate(CATEGORIES)}
    content[np.arange(len(looks)), [cat_index[SOURCES[s][2]] for s in sources]] = 1.0
    return np.concatenate([unit, extreme, content - 1.0 / len(CATEGORIES)], axis=1)


def _render(photo: np.ndarray, a: dict[str, float], size: int, rng: np.random.Generator) -> np.ndarray:
    h, w = photo.shape[:2]
    side = max(8, int(min(h, w) * a["zoom"]))
    # Crop centre: off_centre=0 is the photo centre, 1 the farthest the crop can go.
    angle = rng.uniform(0, 2 * np.pi)
    max_dy, max_dx = (h - side) / 2, (w - side) / 2
    cy = h / 2 + np.sin(angle) * a["off_centre"] * max_dy
    cx = w / 2 + np.cos(angle) * a["off_centre"] * max_dx
    top = int(np.clip(round(cy - side / 2), 0, h - side))
    left = int(np.clip(round(cx - side / 2), 0, w - side))
    pil = Image.fromarray(photo[top : top + side, left : left + side])
    pil = pil.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
    s = a["sharpness"]
    if s < 0:
        pil = pil.filter(ImageFilter.GaussianBlur(radius=-s * size / 24))
    elif s > 0:
        pil = pil.filter(ImageFilter.UnsharpMask(radius=2, percent=int(250 * s), threshold=0))
    x = np.asarray(pil).astype(np.float32) / 255.0
    gray = x @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    x = gray[..., None] + a["saturation"] * (x - gray[..., None])
    x = x * np.array([1 + 0.18 * a["warmth"], 1.0, 1 - 0.18 * a["warmth"]], dtype=np.float32)
    x = x * (2.0 ** a["exposure"])
    x = (x - 0.5) * a["contrast"] + 0.5
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    r2 = ((yy - (size - 1) / 2) ** 2 + (xx - (size - 1) / 2) ** 2) / (size / 2) ** 2
    x = x * (1 - 0.6 * a["vignette"] * np.clip(r2 - 0.3, 0, None))[..., None]
    x = x + rng.normal(0, 0.08 * a["grain"], size=(size, size, 1)).astype(np.float32)
    return (np.clip(x, 0, 1) * 255).round().astype(np.uint8)


def tastes(config: SynthConfig) -> tuple[np.ndarray, np.ndarray]:
    """(shared taste vector, personal taste matrix users x features), from the seed."""
    rng = np.random.default_rng([config.seed, 1])
    dim = len(LOOKS) + 1 + len(CATEGORIES)
    shared = rng.normal(0, SHARED_WEIGHT, size=dim)
    shared[len(LOOKS)] = -abs(shared[len(LOOKS)]) - SHARED_WEIGHT  # bad exposure looks bad
    personal = rng.normal(0, PERSONAL_WEIGHT, size=(config.users, dim))
    return shared, personal


@dataclass(frozen=True)
class UserRatings:
    """One user's rated images and the hidden attributes behind them (for diagnostics)."""

    images: np.ndarray
    labels: np.ndarray
    attributes: np.ndarray  # (n, len(ATTRIBUTES)): the edits applied
    looks: np.ndarray  # (n, len(LOOKS)): what the rendered image shows
    sources: np.ndarray  # index into SOURCES


def user_ratings(config: SynthConfig, user: int) -> UserRatings:
    """Generate one user's images and ratings (independent of the other users)."""
    lo, hi = config.images_per_user
    shared, personal = tastes(config)
    names = list(ATTRIBUTES)
    ranges = np.array(list(ATTRIBUTES.values()))
    rng = np.random.default_rng([config.seed, 2, user])
    n = int(rng.integers(lo, hi + 1))
    attrs = rng.uniform(ranges[:, 0], ranges[:, 1], size=(n, len(names)))
    sources = rng.integers(0, len(SOURCES), size=n)
    photos = _source_photos()
    images = np.stack(
        [
            _render(photos[sources[i]], dict(zip(names, map(float, attrs[i]), strict=True)),
                    config.image_size, rng)
            for i in range(n)
        ]
    )  # fmt: skip
    zoom = attrs[:, names.index("zoom")]
    looks = np.stack([measure_looks(_at_32(img), z) for img, z in zip(images, zoom, strict=True)])
    score = _feature_matrix(looks, sources) @ (shared + personal[user])
    score = score + rng.normal(0, NOISE * np.sqrt(SHARED_WEIGHT**2 + PERSONAL_WEIGHT**2), n)
    z = (score - score.mean()) / (score.std() + 1e-9)
    labels = np.searchsorted(THRESHOLDS, z).astype(np.int64)
    return UserRatings(images, labels, attrs, looks, sources)


def _at_32(image: np.ndarray) -> np.ndarray:
    """Looks are measured at 32 px so that ratings do not depend on the rendering size."""
    if image.shape[0] == 32:
        return image
    return np.asarray(Image.fromarray(image).resize((32, 32), Image.Resampling.BILINEAR))


def load(config: SynthConfig | None = None) -> ImageDataset:
    config = config or SynthConfig()
    lo, hi = config.images_per_user
    if config.users < 1 or lo < 10 or hi < lo:
        raise DatasetError(
            f"aesthetic-synth needs users >= 1 and 10 <= min <= max images per user, got "
            f"users={config.users}, images_per_user={config.images_per_user}"
        )
    per_user = [user_ratings(config, u) for u in range(config.users)]
    return ImageDataset(
        name="aesthetic-synth",
        images=np.concatenate([r.images for r in per_user]),
        labels=np.concatenate([r.labels for r in per_user]),
        classes=CLASSES,
        groups=np.concatenate([np.full(len(r.labels), u) for u, r in enumerate(per_user)]),
        info={"users": config.users, "images_per_user": list(config.images_per_user)},
        features=np.concatenate([_feature_matrix(r.looks, r.sources) for r in per_user]),
    )
