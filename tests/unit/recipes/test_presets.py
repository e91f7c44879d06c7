"""A dataset's preset: the paper's setting for the options the user did not give."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedper import cli
from fedper._recipes.presets import PRESETS, setting
from fedper._recipes.simulation import SimulationConfig
from fedper.common.config_cli import option_values
from fedper.common.errors import ConfigError
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig


def _setting(*argv: str):
    return setting(cli.parse_arguments(["simulate", *argv]))


def test_flickr_aes_defaults_to_flowers_fedper_baseline():
    chosen = _setting("--dataset", "flickr-aes", "--data-root", "/data/flickr")
    sim, data = chosen.simulation, chosen.data
    # conf/flickr.yaml, client.py and mobile_model.py of Flower's baselines/fedper.
    assert (data.image_size, data.num_clients, data.users, data.test_fraction) == (224, 30, 30, 0.2)
    assert sim.training == TrainConfig(local_epochs=4, batch_size=4, learning_rate=0.01, momentum=0.9)
    assert (sim.rounds, sim.kp, sim.fraction, sim.model.name, sim.model.alpha) == (35, 2, 1.0, "mobilenet_v1", 1.0)
    assert set(chosen.from_preset) == set(PRESETS["flickr-aes"].values)


def test_options_given_win_over_the_preset():
    chosen = _setting("--dataset", "flickr-aes", "--image-size", "64", "--batch-size", "32", "--clients", "5")
    assert (chosen.data.image_size, chosen.data.num_clients, chosen.simulation.training.batch_size) == (64, 5, 32)
    assert chosen.simulation.rounds == 35  # not given: still the preset's
    assert "image_size" not in chosen.from_preset and "num_clients" not in chosen.from_preset


def test_a_dataset_without_preset_keeps_the_options_defaults():
    chosen = _setting("--dataset", "digits")
    assert chosen.from_preset == ()
    assert chosen.data == DataConfig(dataset="digits") and chosen.simulation == SimulationConfig()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_names_options_of_simulate_with_their_types_and_new_values(name):
    defaults = {**option_values(DataConfig()), **option_values(SimulationConfig())}
    for option_name, value in PRESETS[name].values.items():
        if defaults[option_name] is not None:  # an optional option (--init) takes its value's type
            assert type(value) is type(defaults[option_name]), option_name
        assert value != defaults[option_name], f"{option_name}: same as the option's default, declare it once"


def test_help_says_flickr_aes_has_its_own_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--dataset flickr-aes has its own defaults" in out and "--image-size 224" in out


def test_aesthetic_synth_starts_from_the_pretrained_base_with_the_ordinal_head_and_a_linear_base_cannot():
    chosen = _setting("--dataset", "aesthetic-synth")
    assert (str(chosen.simulation.init), chosen.simulation.model.head, chosen.simulation.kp) == (
        "pretrained",
        "ordinal",
        1,
    )
    assert _setting("--dataset", "aesthetic-synth", "--init", "scratch").simulation.init == Path("scratch")
    with pytest.raises(ConfigError, match="give --init scratch"):
        _setting("--dataset", "aesthetic-synth", "--base", "linear")
    assert (
        _setting("--dataset", "aesthetic-synth", "--base", "linear", "--init", "scratch").simulation.model.base
        == "linear"
    )
