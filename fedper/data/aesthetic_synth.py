"""aesthetic-synth: a generated stand-in for FLICKR-AES personal aesthetics.

Every image is a new composite: a *subject* (a crop of one of 22 real photographs
or one of 200 real faces, all shipped inside installed packages) placed on a
*background* (a crop of another photograph, or a sky-and-ground gradient), with a
focus (subject and background blur: depth of field), a position and a size in
the frame, then photographic edits (exposure, contrast, saturation, white
balance, vignetting, grain). No two images share their pixels.

Users differ as real raters do (docs/DATA.md):

- in **what they photograph**: each user draws subjects from their own mix of
  eight content categories;
- in **taste**: a rating is ``(shared + personal_u) . features(image) + noise_u``
  where the features are measured on the rendered image: exposure (and how far it
  is from a good one), contrast, colourfulness, warmth, detail, vignetting, how
  much sharper the subject is than its background, the subject's distance from a
  rule-of-thirds point, its size, the colour harmony of subject and background,
  and the content category. Several are not linear in pixels. The personal part
  is stronger than the shared one, so users disagree; ``noise_u`` differs by user
  (some raters are inconsistent);
- in **how they use the scale**: harsh or generous (an offset) and using the whole
  1-5 range or mostly its middle (a spread), so class frequencies differ by user.

Everything follows from the seed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import skimage.data
import sklearn.datasets
from PIL import Image, ImageDraw, ImageFilter

from fedper.data.dataset import DatasetError, ImageDataset
from fedper.data.imaging import to_rgb_uint8

CATEGORIES: tuple[str, ...] = (
    "people", "animal", "food", "vehicle", "architecture", "nature", "space", "abstract",
)  # fmt: skip
# Subject photographs: (file, package, content category). Faces come from LFW_FACES as well.
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("astronaut.png", "skimage", "people"),
    ("camera.png", "skimage", "people"),
    ("grace_hopper.jpg", "matplotlib", "people"),
    ("chelsea.png", "skimage", "animal"),
    ("horse.png", "skimage", "animal"),
    ("coffee.png", "skimage", "food"),
    ("rocket.jpg", "skimage", "vehicle"),
    ("motorcycle_left.png", "skimage", "vehicle"),
    ("motorcycle_right.png", "skimage", "vehicle"),
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
    ("cell.png", "skimage", "abstract"),
    ("clock_motion.png", "skimage", "abstract"),
    ("color.png", "skimage", "abstract"),
)
LFW_FACES = "lfw_subset.npy"  # 200 grey 25x25 faces (scikit-image), "people" subjects
FACE_SHARE = 0.6  # of a user's "people" subjects, the share that are LFW faces
# Edits, each drawn uniformly from its range for every image.
ATTRIBUTES: dict[str, tuple[float, float]] = {
    "exposure": (-1.0, 1.0),  # stops
    "contrast": (0.5, 1.6),
    "saturation": (0.0, 1.8),
    "warmth": (-1.0, 1.0),
    "subject_blur": (0.0, 1.0),  # missed focus
    "background_blur": (0.0, 1.0),  # depth of field
    "subject_size": (0.3, 0.75),  # subject side / frame side
    "subject_x": (0.0, 1.0),  # subject centre, as a fraction of where it can go
    "subject_y": (0.0, 1.0),
    "vignette": (0.0, 1.0),
    "grain": (0.0, 1.0),
}
CLASSES = ("1", "2", "3", "4", "5")  # the user's rating
# Thresholds on a user's (offset, spread) standardized score: 10/22/36/22/10 % for a neutral rater.
THRESHOLDS = (-1.25, -0.45, 0.45, 1.25)
SHARED_WEIGHT = 0.6  # scale of the taste everybody shares
PERSONAL_WEIGHT = 1.0  # scale of each user's own taste (stronger: users disagree)
NOISE = (0.25, 0.6)  # range of the users' rating noise, in units of the score's std
OFFSET = 0.5  # std of a user's harshness (< 0) or generosity (> 0), in score stds
SPREAD = (0.6, 1.4)  # range of how much of the scale a user uses (< 1: mostly the middle)
# Badly exposed photos and a subject blurrier than its background look bad to everybody: the
# personal part of these weights is scaled down so that it rarely flips their sign.
UNIVERSAL = {"bad_exposure": -1.0, "subject_pop": 1.0}
UNIVERSAL_PERSONAL = 0.3
CONTENT_CONCENTRATION = 0.7  # Dirichlet parameter of each user's content mix (small: few kinds)
WORK_SIZE = 64  # composites are made at this side, then resized
LOOKS = (
    "brightness", "contrast", "colourfulness", "warmth", "detail", "vignetting",
    "subject_pop", "thirds_distance", "subject_size", "harmony",
)  # fmt: skip
FEATURES = (*LOOKS, "bad_exposure", *(f"content_{c}" for c in CATEGORIES))


@dataclass(frozen=True)
class SynthConfig:
    users: int = 30
    images_per_user: tuple[int, int] = (100, 200)
    image_size: int = 32
    seed: int = 0


def _source_dirs() -> dict[str, Path]:
    return {
        "skimage": Path(skimage.data.__file__).parent,
        "sklearn": Path(sklearn.datasets.__file__).parent / "images",
        "matplotlib": Path(matplotlib.get_data_path()) / "sample_data",
    }


@functools.cache
def _source_photos() -> tuple[np.ndarray, ...]:
    dirs = _source_dirs()
    photos = []
    for name, package, _ in SOURCES:
        path = dirs[package] / name
        try:
            with Image.open(path) as im:
                photos.append(to_rgb_uint8(np.asarray(im.convert("RGB"))))
        except OSError as exc:
            raise DatasetError(f"aesthetic-synth needs the bundled photo {path}: {exc}") from exc
    return tuple(photos)


@functools.cache
def _faces() -> np.ndarray:
    path = _source_dirs()["skimage"] / LFW_FACES
    try:
        faces = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"aesthetic-synth needs the bundled faces {path}: {exc}") from exc
    if faces.ndim != 3:
        raise DatasetError(f"{path}: expected (n, h, w) grey faces, got shape {faces.shape}")
    return np.stack([to_rgb_uint8(f) for f in faces])


def _crop(photo: np.ndarray, side_fraction: float, rng: np.random.Generator) -> np.ndarray:
    h, w = photo.shape[:2]
    side = max(8, int(min(h, w) * side_fraction))
    top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    return photo[top : top + side, left : left + side]


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A crop of a random photograph, or a sky-to-ground gradient with a horizon."""
    if rng.random() < 0.35:
        sky, ground = rng.uniform(0.1, 0.95, size=(2, 3))
        horizon = rng.uniform(0.3, 0.8)
        t = np.linspace(0, 1, size)[:, None, None]
        img = np.where(t < horizon, sky + (t / horizon) * 0.2, ground * (1.2 - 0.4 * t))
        return (np.clip(np.broadcast_to(img, (size, size, 3)), 0, 1) * 255).astype(np.uint8)
    photos = _source_photos()
    crop = _crop(photos[int(rng.integers(len(photos)))], rng.uniform(0.3, 1.0), rng)
    return np.asarray(Image.fromarray(crop).resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0))


def _subject(category: int, rng: np.random.Generator) -> np.ndarray:
    if CATEGORIES[category] == "people" and rng.random() < FACE_SHARE:
        faces = _faces()
        return faces[int(rng.integers(len(faces)))]
    choices = [i for i, (_, _, c) in enumerate(SOURCES) if c == CATEGORIES[category]]
    return _crop(_source_photos()[choices[int(rng.integers(len(choices)))]], rng.uniform(0.3, 0.8), rng)


@dataclass(frozen=True)
class _Layout:
    """Where the subject sits in the WORK_SIZE frame (pixels)."""

    side: int
    top: int
    left: int

    @property
    def centre(self) -> tuple[float, float]:
        return (self.top + self.side / 2) / WORK_SIZE, (self.left + self.side / 2) / WORK_SIZE


def _layout(a: dict[str, float]) -> _Layout:
    side = max(8, round(a["subject_size"] * WORK_SIZE))
    room = WORK_SIZE - side
    return _Layout(side, round(a["subject_y"] * room), round(a["subject_x"] * room))


def _mask(layout: _Layout) -> np.ndarray:
    """A soft ellipse: the subject's extent in the frame, values in [0, 1]."""
    m = Image.new("L", (WORK_SIZE, WORK_SIZE), 0)
    inset = layout.side * 0.06
    ImageDraw.Draw(m).ellipse(
        (layout.left + inset, layout.top + inset, layout.left + layout.side - inset, layout.top + layout.side - inset),
        fill=255,
    )
    m = m.filter(ImageFilter.GaussianBlur(radius=max(1.0, layout.side / 14)))
    return np.asarray(m).astype(np.float32) / 255.0


def _render(category: int, a: dict[str, float], size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(image at ``size``, subject mask at WORK_SIZE) of one composite with its edits."""
    layout = _layout(a)
    bg = Image.fromarray(_background(rng, WORK_SIZE))
    bg = bg.filter(ImageFilter.GaussianBlur(radius=a["background_blur"] * 3.0))
    subject = Image.fromarray(_subject(category, rng)).resize(
        (layout.side, layout.side), Image.Resampling.BILINEAR, reducing_gap=3.0
    )
    subject = subject.filter(ImageFilter.GaussianBlur(radius=a["subject_blur"] * 3.0))
    mask = _mask(layout)
    frame = np.asarray(bg).astype(np.float32) / 255.0
    placed = np.zeros_like(frame)
    placed[layout.top : layout.top + layout.side, layout.left : layout.left + layout.side] = (
        np.asarray(subject).astype(np.float32) / 255.0
    )
    x = frame * (1 - mask[..., None]) + placed * mask[..., None]
    gray = x @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    x = gray[..., None] + a["saturation"] * (x - gray[..., None])
    x = x * np.array([1 + 0.18 * a["warmth"], 1.0, 1 - 0.18 * a["warmth"]], dtype=np.float32)
    x = x * (2.0 ** a["exposure"])
    x = (x - 0.5) * a["contrast"] + 0.5
    yy, xx = np.mgrid[0:WORK_SIZE, 0:WORK_SIZE].astype(np.float32)
    r2 = ((yy - (WORK_SIZE - 1) / 2) ** 2 + (xx - (WORK_SIZE - 1) / 2) ** 2) / (WORK_SIZE / 2) ** 2
    x = x * (1 - 0.6 * a["vignette"] * np.clip(r2 - 0.3, 0, None))[..., None]
    x = x + rng.normal(0, 0.04 * a["grain"], size=(WORK_SIZE, WORK_SIZE, 1)).astype(np.float32)
    image = (np.clip(x, 0, 1) * 255).round().astype(np.uint8)
    if size != WORK_SIZE:
        image = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0))
    return image, mask


def measure_looks(image: np.ndarray, mask: np.ndarray, a: dict[str, float]) -> np.ndarray:
    """The visible properties of LOOKS, before standardization, measured on the WORK_SIZE image
    (so that ratings do not depend on the size the dataset is rendered at)."""
    x = image.astype(np.float64) / 255.0
    lum = x @ np.array([0.299, 0.587, 0.114])
    rg = x[..., 0] - x[..., 1]
    yb = (x[..., 0] + x[..., 1]) / 2 - x[..., 2]
    colourful = np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean())
    gy, gx = np.abs(np.diff(lum, axis=0))[:, :-1], np.abs(np.diff(lum, axis=1))[:-1, :]
    grad = gy + gx
    m = mask[:-1, :-1].astype(np.float64)
    detail_in = (grad * m).sum() / max(m.sum(), 1e-6)
    detail_out = (grad * (1 - m)).sum() / max((1 - m).sum(), 1e-6)
    q = WORK_SIZE // 4
    centre = lum[q:-q, q:-q].mean()
    edge = (lum.sum() - lum[q:-q, q:-q].sum()) / (lum.size - lum[q:-q, q:-q].size)
    layout = _layout(a)
    cy, cx = layout.centre
    thirds = min(np.hypot(cy - ty, cx - tx) for ty in (1 / 3, 2 / 3) for tx in (1 / 3, 2 / 3))
    hue_in = np.arctan2((yb * mask).sum(), (rg * mask).sum())
    hue_out = np.arctan2((yb * (1 - mask)).sum(), (rg * (1 - mask)).sum())
    return np.array(
        [lum.mean(), lum.std(), colourful, (x[..., 0] - x[..., 2]).mean(), grad.mean(), centre - edge,
         detail_in - detail_out, thirds, a["subject_size"], np.cos(hue_in - hue_out)]
    )  # fmt: skip


@functools.cache
def _looks_scale() -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of each look over a fixed calibration sample (the same for every seed)."""
    rng = np.random.default_rng(20_190_818)
    rows = []
    for _ in range(400):
        a = _draw_attributes(rng)
        img, mask = _render(int(rng.integers(len(CATEGORIES))), a, WORK_SIZE, rng)
        rows.append(measure_looks(img, mask, a))
    m = np.array(rows)
    return m.mean(axis=0), m.std(axis=0) + 1e-9


def _draw_attributes(rng: np.random.Generator) -> dict[str, float]:
    ranges = np.array(list(ATTRIBUTES.values()))
    return dict(zip(ATTRIBUTES, map(float, rng.uniform(ranges[:, 0], ranges[:, 1])), strict=True))


def feature_matrix(looks: np.ndarray, categories: np.ndarray) -> np.ndarray:
    """What a taste is linear in (FEATURES): standardized looks, badness of exposure, content."""
    mean, std = _looks_scale()
    unit = (looks - mean) / std
    bad_exposure = unit[:, :1] ** 2 - 1.0  # too dark or too bright
    content = np.zeros((len(looks), len(CATEGORIES)))
    content[np.arange(len(looks)), categories] = 1.0
    return np.concatenate([unit, bad_exposure, content - 1.0 / len(CATEGORIES)], axis=1)


@dataclass(frozen=True)
class Rater:
    """One user: what they like, what they photograph and how they use the 1-5 scale."""

    taste: np.ndarray  # (len(FEATURES),) shared + personal
    content_mix: np.ndarray  # (len(CATEGORIES),) probabilities
    noise: float  # rating noise, in score stds
    offset: float  # > 0 generous, < 0 harsh
    spread: float  # < 1 uses mostly the middle of the scale


def tastes(config: SynthConfig) -> tuple[np.ndarray, np.ndarray]:
    """(shared taste vector, personal taste matrix users x features), from the seed."""
    rng = np.random.default_rng([config.seed, 1])
    shared = rng.normal(0, SHARED_WEIGHT, size=len(FEATURES))
    personal = rng.normal(0, PERSONAL_WEIGHT, size=(config.users, len(FEATURES)))
    for name, sign in UNIVERSAL.items():  # what (almost) nobody disagrees about
        i = FEATURES.index(name)
        shared[i] = sign * (abs(shared[i]) + SHARED_WEIGHT)
        personal[:, i] *= UNIVERSAL_PERSONAL
    return shared, personal


def raters(config: SynthConfig) -> list[Rater]:
    shared, personal = tastes(config)
    rng = np.random.default_rng([config.seed, 3])
    out = []
    for u in range(config.users):
        out.append(
            Rater(
                taste=shared + personal[u],
                content_mix=rng.dirichlet(np.full(len(CATEGORIES), CONTENT_CONCENTRATION)),
                noise=float(rng.uniform(*NOISE)),
                offset=float(rng.normal(0, OFFSET)),
                spread=float(rng.uniform(*SPREAD)),
            )
        )
    return out


@dataclass(frozen=True)
class UserRatings:
    """One user's rated images and what is behind them (for diagnostics and the baselines)."""

    images: np.ndarray
    labels: np.ndarray
    attributes: np.ndarray  # (n, len(ATTRIBUTES)): the edits applied
    looks: np.ndarray  # (n, len(LOOKS)): what the rendered image shows
    categories: np.ndarray  # index into CATEGORIES
    features: np.ndarray  # (n, len(FEATURES)): what the ratings are linear in
    scores: np.ndarray  # the latent score before the rater's scale and thresholds


def user_ratings(config: SynthConfig, user: int, rater: Rater | None = None) -> UserRatings:
    """Generate one user's images and ratings (independent of the other users)."""
    rater = rater or raters(config)[user]
    lo, hi = config.images_per_user
    rng = np.random.default_rng([config.seed, 2, user])
    n = int(rng.integers(lo, hi + 1))
    categories = rng.choice(len(CATEGORIES), size=n, p=rater.content_mix)
    attrs, images, looks = [], [], []
    for i in range(n):
        a = _draw_attributes(rng)
        work, mask = _render(int(categories[i]), a, WORK_SIZE, rng)
        attrs.append(list(a.values()))
        looks.append(measure_looks(work, mask, a))
        images.append(_resized(work, config.image_size))
    features = feature_matrix(np.array(looks), categories)
    score = features @ rater.taste
    score = (score - score.mean()) / (score.std() + 1e-9)
    noisy = score + rng.normal(0, rater.noise, n)
    z = (noisy - noisy.mean()) / (noisy.std() + 1e-9)
    labels = np.searchsorted(THRESHOLDS, rater.spread * z + rater.offset).astype(np.int64)
    return UserRatings(np.stack(images), labels, np.array(attrs), np.array(looks), categories, features, score)


def _resized(image: np.ndarray, size: int) -> np.ndarray:
    if size == WORK_SIZE:
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0))


def load(config: SynthConfig | None = None) -> ImageDataset:
    config = config or SynthConfig()
    lo, hi = config.images_per_user
    if config.users < 1 or lo < 10 or hi < lo:
        raise DatasetError(
            f"aesthetic-synth needs users >= 1 and 10 <= min <= max images per user, got "
            f"users={config.users}, images_per_user={config.images_per_user}"
        )
    if config.image_size < 8:
        raise DatasetError(f"aesthetic-synth needs an image size >= 8, got {config.image_size}")
    everyone = raters(config)
    per_user = [user_ratings(config, u, everyone[u]) for u in range(config.users)]
    return ImageDataset(
        name="aesthetic-synth",
        images=np.concatenate([r.images for r in per_user]),
        labels=np.concatenate([r.labels for r in per_user]),
        classes=CLASSES,
        groups=np.concatenate([np.full(len(r.labels), u) for u, r in enumerate(per_user)]),
        info={"users": config.users, "images_per_user": list(config.images_per_user)},
        features=np.concatenate([r.features for r in per_user]),
    )
