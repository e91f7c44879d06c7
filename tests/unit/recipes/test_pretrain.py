"""fedper pretrain: rater-free data, a base --init accepts, a model card, resumable and deterministic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from fedper._recipes.pretrain import BASE, CARD, PretrainConfig, run_pretrain
from fedper.checkpoints import init_base, read_checkpoint
from fedper.common.errors import ConfigError
from fedper.data import aesthetic_synth, pretext
from fedper.models import ModelConfig, build_model
from fedper.pretrained import PACKAGED_BASE, PACKAGED_CARD, PRETRAINED, SCRATCH, checkpoint_path
from fedper.results import config_json


def _tiny(out: Path, **kw: object) -> PretrainConfig:
    return PretrainConfig(**{"out": out, "images": 120, "epochs": 2, "batch_size": 16, "threads": 1, **kw})  # type: ignore[arg-type]


def test_no_rater_enters_the_pretext_data(monkeypatch):
    """Everything that holds a rating or a taste is made to fail: the pretext data is still made."""

    def forbidden(*_a: object, **_k: object) -> None:
        raise AssertionError("pretraining touched a rater")

    for name in ("raters", "tastes", "user_ratings", "feature_matrix", "load"):
        monkeypatch.setattr(aesthetic_synth, name, forbidden)
    batch = pretext.render(seed=0, start=0, count=6, image_size=32)
    assert batch.images.shape == (6, 32, 32, 3) and batch.targets.shape == (6, len(pretext.REGRESSION_TARGETS))
    assert np.isfinite(batch.targets).all() and set(batch.categories) <= set(range(len(pretext.CATEGORIES)))


def test_examples_render_alone_and_apart_from_every_users_photos():
    whole = pretext.render(seed=3, start=0, count=8, image_size=32)
    part = pretext.render(seed=3, start=5, count=3, image_size=32)
    assert np.array_equal(whole.images[5:], part.images) and np.array_equal(whole.targets[5:], part.targets)
    # The users' photos of the same seed come from other streams: none is a pretext example.
    users = aesthetic_synth.user_ratings(aesthetic_synth.SynthConfig(seed=3, images_per_user=(10, 10)), 0)
    pretext_images = {im.tobytes() for im in whole.images}
    assert not any(im.tobytes() in pretext_images for im in users.images)


def test_pretrain_writes_a_base_init_accepts_and_a_model_card(tmp_path):
    card = run_pretrain(_tiny(tmp_path / "p"))
    base = tmp_path / "p" / BASE
    assert card == json.loads((tmp_path / "p" / CARD).read_text())
    assert card["base"]["sha256"] == hashlib.sha256(base.read_bytes()).hexdigest()
    assert card["data"]["raters"].startswith("none")
    assert [h["epoch"] for h in card["history"]] == [1, 2]
    assert set(card["pretext"]["held_out_scores"]) == {*pretext.REGRESSION_TARGETS, "category_accuracy"}
    for kp in (0, 1, 2):  # the base has everything but the classifier: any kp can start from it
        model = build_model(ModelConfig(num_classes=5, input_size=32), seed=0)
        assert init_base(model, read_checkpoint(base, "mobilenet_v1"), kp=kp).layout == "fedper"


@pytest.mark.slow
def test_an_interrupted_pretraining_resumes_to_the_same_base(tmp_path):
    run_pretrain(_tiny(tmp_path / "whole"))

    def stop_in_the_second_epoch(done: int, total: int, what: str) -> None:
        if what.startswith("epoch 2"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pretrain(_tiny(tmp_path / "cut"), stop_in_the_second_epoch)
    assert not (tmp_path / "cut" / BASE).exists()
    card = run_pretrain(_tiny(tmp_path / "cut"))  # the same command again
    assert (tmp_path / "cut" / BASE).read_bytes() == (tmp_path / "whole" / BASE).read_bytes()
    assert [h["epoch"] for h in card["history"]] == [1, 2]
    with pytest.raises(ConfigError, match="other settings"):
        run_pretrain(_tiny(tmp_path / "cut", learning_rate=1e-3))


@pytest.mark.slow
@pytest.mark.numeric
def test_pretraining_teaches_the_base_what_photos_show(tmp_path, claim):
    """Held-out composites after 3 epochs on 1,350: contrast R² 0.42-0.51 over seeds 0-1 and the
    default and AVX2 kernels at 1 thread (brightness varies more: 0.18-0.48); the bound is 0.2."""
    card = run_pretrain(_tiny(tmp_path / "p", images=1500, epochs=3, batch_size=64))
    claim.above("held-out R² of the contrast look", card["pretext"]["held_out_scores"]["look.contrast"], 0.2)


def test_the_probe_scores_each_user_and_each_generator_feature(tmp_path):
    from fedper._recipes.pretrain_probe import probe_seed, summary, user_probe
    from fedper.data.aesthetic_synth import FEATURES

    run_pretrain(_tiny(tmp_path / "p"))
    result = probe_seed(tmp_path / "p" / BASE, 32, seed=1, users=3, images_per_user=(30, 30))
    for key in ("majority", "random", "pretrained", "generator_features", "random_ordinal", "pretrained_ordinal"):
        assert len(result[key]) == 3 and all(0.0 <= a <= 1.0 for a in result[key])
    assert set(result["pretrained_feature_r2"]) == set(FEATURES)
    assert "| 1 |" in summary([result])
    # Features that give the labels away are found whatever C the validation quarter picks.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 80)
    x = np.eye(3)[y] + rng.normal(0, 0.01, (80, 3))
    assert user_probe(x[:60], y[:60], x[60:], y[60:], seed=0) == 1.0


def test_the_packaged_base_is_what_its_card_says_and_starts_the_flagship_model():
    """The committed base: its bytes are the card's sha256, the card's settings are ``fedper
    pretrain``'s defaults (what README's command reproduces), no rater entered it, and
    ``--init pretrained`` starts aesthetic-synth's default model at any kp with it."""
    card = json.loads(PACKAGED_CARD.read_text())
    assert hashlib.sha256(PACKAGED_BASE.read_bytes()).hexdigest() == card["base"]["sha256"]
    made_with = {k: v for k, v in card["config"].items() if k not in ("out", "threads")}
    defaults = {k: v for k, v in config_json(PretrainConfig()).items() if k not in ("out", "threads")}
    # --targets, --model and --model-arg came later; their defaults are what every run before them trained.
    assert {"targets": "all", "model": "mobilenet_v1", "model_arg": [], **made_with} == defaults
    assert card["data"]["raters"].startswith("none")
    assert checkpoint_path(Path(PRETRAINED)) == PACKAGED_BASE and checkpoint_path(Path(SCRATCH)) is None
    assert checkpoint_path(None) is None and checkpoint_path(Path("my.safetensors")) == Path("my.safetensors")
    model = build_model(ModelConfig(num_classes=5, head="ordinal"), seed=0)
    source = init_base(model, read_checkpoint(PACKAGED_BASE, "mobilenet_v1"), kp=0)
    assert source.tensors == card["base"]["tensors"] and source.fresh[0].startswith("classifier.")
    stem = np.asarray(read_checkpoint(PACKAGED_BASE, "mobilenet_v1").tensors["stem.conv.weight"])
    assert np.array_equal(model.state_dict()["stem.conv.weight"].numpy(), stem)
