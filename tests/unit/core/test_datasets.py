import dataclasses
import json
import pickle
import re

import numpy as np
import pytest
from PIL import Image

from fedper.cli import main
from fedper.common.errors import ConfigError
from fedper.data import (
    DataConfig,
    DatasetError,
    aesthetic_synth,
    cifar,
    flickr_aes,
    load_dataset,
    load_federated,
)


def test_digits_are_the_real_bundled_scans():
    ds = load_dataset(DataConfig(dataset="digits"))
    assert ds.images.shape == (1797, 32, 32, 3) and ds.images.dtype == np.uint8
    assert np.bincount(ds.labels).min() > 170
    assert (ds.images[..., 0] == ds.images[..., 2]).all()  # grey scans replicated to RGB
    # Strokes are bright on dark background; a "1" has less ink than an "8".
    ink = [ds.images[ds.labels == d].mean() for d in range(10)]
    assert ink[1] < ink[8]


def test_aesthetic_synth_is_deterministic_and_seed_dependent():
    cfg = aesthetic_synth.SynthConfig(users=3, images_per_user=(20, 30), seed=5)
    a, b = aesthetic_synth.load(cfg), aesthetic_synth.load(cfg)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    c = aesthetic_synth.load(aesthetic_synth.SynthConfig(users=3, images_per_user=(20, 30), seed=6))
    assert not np.array_equal(a.labels[:20], c.labels[:20])
    assert set(np.unique(a.groups)) == {0, 1, 2}
    assert all(20 <= (a.groups == u).sum() <= 30 for u in range(3))


def test_aesthetic_synth_users_disagree_but_share_a_taste():
    cfg = aesthetic_synth.SynthConfig(users=30, seed=0)
    shared, personal = aesthetic_synth.tastes(cfg)
    tastes = shared + personal
    corr = np.corrcoef(tastes)[np.triu_indices(30, 1)]
    # Tastes correlate weakly: a shared part everyone has, a stronger personal part.
    assert 0.05 < corr.mean() < 0.6
    assert corr.min() < 0  # some users even have opposite tastes
    assert np.linalg.norm(personal, axis=1).mean() > np.linalg.norm(shared)
    # ... except about exposure and focus, which nearly everybody judges the same way.
    for name, sign in aesthetic_synth.UNIVERSAL.items():
        assert (np.sign(tastes[:, aesthetic_synth.FEATURES.index(name)]) == sign).mean() >= 0.9


def test_aesthetic_synth_raters_differ_in_scale_and_subjects():
    cfg = aesthetic_synth.SynthConfig(users=12, images_per_user=(150, 150), seed=0)
    raters = aesthetic_synth.raters(cfg)
    per_user = [aesthetic_synth.user_ratings(cfg, u, raters[u]) for u in range(12)]
    means = np.array([r.labels.mean() for r in per_user])
    # Harsh raters give lower ratings on average than generous ones, and not by a little.
    offsets = np.array([r.offset for r in raters])
    assert np.corrcoef(offsets, means)[0, 1] > 0.7 and means.max() - means.min() > 0.8
    # Users photograph different things: their content mixes are far apart.
    mixes = np.array([np.bincount(r.categories, minlength=len(aesthetic_synth.CATEGORIES)) / 150 for r in per_user])
    assert np.abs(mixes[:, None] - mixes[None]).sum(axis=2).max() > 1.0
    # Ratings follow each user's own taste: the latent score orders the ratings.
    for r in per_user:
        assert np.corrcoef(r.scores, r.labels)[0, 1] > 0.6


def test_aesthetic_synth_renders_unique_photographic_composites_with_every_score():
    ds = load_dataset(DataConfig(dataset="aesthetic-synth", users=4, images_per_user=(60, 60)))
    assert ds.images.shape == (240, 32, 32, 3)
    assert set(np.unique(ds.labels)) == {0, 1, 2, 3, 4}
    assert ds.images.std() > 30  # photographs, not flat colour
    assert len({img.tobytes() for img in ds.images}) == 240
    assert ds.features is not None and ds.features.shape == (240, len(aesthetic_synth.FEATURES))


def test_aesthetic_synth_ratings_do_not_depend_on_the_rendering_size():
    small = aesthetic_synth.load(aesthetic_synth.SynthConfig(users=2, images_per_user=(20, 20), image_size=32))
    large = aesthetic_synth.load(aesthetic_synth.SynthConfig(users=2, images_per_user=(20, 20), image_size=96))
    assert large.images.shape[1:] == (96, 96, 3)
    assert np.array_equal(small.labels, large.labels)


def _write_batch(path, data, labels, key="labels"):
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"test", key.encode(): labels, b"data": data}, f, protocol=2)


def test_cifar10_reads_the_official_format(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    expected = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=4).tolist()
        _write_batch(root / name, data, labels)
        expected.append((data, labels))
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_cases_per_batch": 4}, f, protocol=2)
    ds = load_dataset(DataConfig(dataset="cifar10", data_root=tmp_path))
    assert ds.images.shape == (24, 32, 32, 3)
    assert ds.classes[0] == "airplane"
    # Channel planes (R 1024, G 1024, B 1024) become HWC pixels.
    d0 = expected[0][0][0]
    assert ds.images[0, 0, 1].tolist() == [d0[1], d0[1024 + 1], d0[2048 + 1]]
    assert ds.labels.tolist() == [lab for _, labels in expected for lab in labels]


def test_cifar100_reads_fine_labels(tmp_path):
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    for name, n in (("train", 6), ("test", 2)):
        with open(root / name, "wb") as f:
            pickle.dump(
                {
                    b"data": np.zeros((n, 3072), np.uint8),
                    b"fine_labels": list(range(n)),
                    b"coarse_labels": [0] * n,
                },
                f,
                protocol=2,
            )
    with open(root / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"c{i}".encode() for i in range(100)]}, f, protocol=2)
    ds = load_dataset(DataConfig(dataset="cifar100", data_root=tmp_path))
    assert ds.num_classes == 100 and ds.labels.tolist() == [0, 1, 2, 3, 4, 5, 0, 1]


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_cifar_reader_refuses_code_in_pickles(tmp_path):
    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({b"data": _Evil()}, f, protocol=2)
    with pytest.raises(DatasetError, match="refusing to load .*print"):
        cifar.read_batch(path)


def test_missing_cifar_files_are_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="no CIFAR files under"):
        load_dataset(DataConfig(dataset="cifar10", data_root=tmp_path))
    with pytest.raises(DatasetError, match="--data-root"):
        load_dataset(DataConfig(dataset="cifar10"))


def _flickr(tmp_path, workers):
    (tmp_path / "40K").mkdir()
    lines = ["worker, imagePair, score"]
    rng = np.random.default_rng(0)
    for worker, scores in workers.items():
        for i, s in enumerate(scores):
            name = f"farm1_{worker}_{i}.jpg"
            Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(tmp_path / "40K" / name)
            lines.append(f"{worker}, {name}, {s}")
    (tmp_path / flickr_aes.RATINGS_CSV).write_text("\n".join(lines) + "\n")


def test_flickr_aes_selects_workers_like_the_paper(tmp_path):
    ok = [1, 2, 3, 4, 5] * 12  # 60 ratings, every score 12 times
    _flickr(
        tmp_path,
        {
            "A1": ok,
            "A2": ok + [3] * 10,
            "TOOFEW": [1, 2, 3, 4, 5] * 11,  # 55 ratings
            "NOFIVES": [1, 2, 3, 4] * 15 + [5] * 3,  # only three 5s
        },
    )
    ratings = flickr_aes.read_ratings(tmp_path / flickr_aes.RATINGS_CSV)
    assert flickr_aes.eligible_workers(ratings) == ["A1", "A2"]
    ds = load_dataset(DataConfig(dataset="flickr-aes", data_root=tmp_path, users=2, image_size=32))
    assert ds.images.shape == (130, 32, 32, 3)
    assert sorted(np.bincount(ds.groups).tolist()) == [60, 70]
    assert ds.labels.min() == 0 and ds.labels.max() == 4
    fed = load_federated(DataConfig(dataset="flickr-aes", data_root=tmp_path, users=2, num_clients=2))
    assert fed.partition == "user"
    with pytest.raises(DatasetError, match="only 2 workers"):
        load_dataset(DataConfig(dataset="flickr-aes", data_root=tmp_path, users=3))


def test_flickr_aes_bad_csv_is_a_clear_error(tmp_path):
    (tmp_path / flickr_aes.RATINGS_CSV).write_text("worker, imagePair, score\nA1, x.jpg, 9\n")
    with pytest.raises(DatasetError, match=r":2: score 9 outside 1..5"):
        flickr_aes.read_ratings(tmp_path / flickr_aes.RATINGS_CSV)


@pytest.mark.slow
def test_simulate_on_flickr_aes_files_takes_the_paper_setting_but_for_what_is_given(tmp_path, capsys):
    _flickr(tmp_path, {"A1": [1, 2, 3, 4, 5] * 12, "A2": [1, 2, 3, 4, 5] * 14})
    out = tmp_path / "run"
    argv = ["simulate", "--dataset", "flickr-aes", "--data-root", str(tmp_path), "--out", str(out),
            # Given for speed; batch size, local epochs and the rest stay the preset's.
            "--users", "2", "--clients", "2", "--image-size", "32", "--alpha", "0.25", "--rounds", "1",
            "--algorithms", "fedper", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["data"]["image_size"] == 32 and config["model"]["alpha"] == 0.25
    training = {k: config["simulation"][k] for k in ("local_epochs", "batch_size", "learning_rate", "momentum")}
    assert training == {"local_epochs": 4, "batch_size": 4, "learning_rate": 0.01, "momentum": 0.9}
    assert config["simulation"]["rounds"] == 1
    assert config["clients_train_samples"] == [48, 56]
    err = " ".join(capsys.readouterr().err.split())
    assert "flickr-aes: 2 clients, 32 px, mobilenet_v1 width 0.25, kp 2, 1 round x 4 local epochs, batch 4" in err
    assert "conf/flickr.yaml: batch_size, local_epochs)" in err
    # 48 and 56 samples in batches of 4, over 4 local epochs: (12 + 14) * 4 steps.
    assert re.search(
        r"estimate: about \d+ s on this machine \(\d+ ms per step x 104 steps per round x 1 round x 1 algorithm;", err
    )


@pytest.mark.slow
def test_validate_scores_on_part_of_the_training_photos_and_never_on_the_test_photos():
    config = DataConfig(dataset="aesthetic-synth", partition="user", users=12, num_clients=4, seed=3)
    plain, validating = load_federated(config), load_federated(dataclasses.replace(config, validate=True))
    for ours, theirs in zip(validating.clients, plain.clients, strict=True):
        assert np.array_equal(np.sort(np.concatenate([ours.train, ours.test])), theirs.train)
        assert not set(ours.test) & set(theirs.test) and not set(ours.train) & set(theirs.test)
        assert len(ours.test) == round(len(theirs.train) * config.test_fraction)
    with pytest.raises(ConfigError, match="drop --holdout-clients"):
        dataclasses.replace(config, validate=True, holdout_clients=2)
