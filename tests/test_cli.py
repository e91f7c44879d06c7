"""The command line's contract: one training config composed everywhere, and errors that are
one line when expected and a traceback when they are bugs."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from export.pipeline import ExportConfig
from fedper import cli
from fedper.config_cli import add_arguments, from_arguments
from fedper.errors import ConfigError, FedperError
from fedper.manifest import TrainingDefaults
from fedper.train_config import TrainConfig
from recipes.demo import DemoConfig
from recipes.simulation import SimulationConfig
from server.config import ServerConfig

HOLDERS = [ServerConfig, ExportConfig, SimulationConfig, DemoConfig]


def _parse(cls: type, argv: list[str]) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser, cls)
    return from_arguments(cls, parser.parse_args(argv))


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda c: c.__name__)
def test_every_command_takes_the_training_settings_from_the_one_config(holder):
    config = _parse(holder, ["--local-epochs", "4", "--lr", "0.05", "--batch-size", "16", "--momentum", "0.5"])
    assert config.training == TrainConfig(local_epochs=4, batch_size=16, learning_rate=0.05, momentum=0.5)
    # No holder declares a training setting of its own beside the composed one.
    names = {f.name for f in dataclasses.fields(holder)}
    assert not names & {f.name for f in dataclasses.fields(TrainConfig)}


def test_defaults_live_in_one_place_and_recipes_override_them_by_name():
    base = TrainConfig()
    assert ServerConfig().training == base and ExportConfig().training == base
    assert TrainingDefaults().train_config() == base  # the manifest's defaults are the same ones
    # The recipes train longer, stated as an override of that one config.
    assert SimulationConfig().training == dataclasses.replace(base, local_epochs=2)
    assert DemoConfig().training == dataclasses.replace(base, local_epochs=3)
    assert _parse(DemoConfig, []).training.local_epochs == 3  # the command line shows the recipe's default


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--local-epochs", "0"], "--local-epochs must be >= 1"),
        (["--batch-size", "1"], "--batch-size must be >= 2"),
        (["--lr", "0"], "--learning-rate must be a positive number"),
        (["--lr", "nan"], "--learning-rate must be a positive number"),
        (["--momentum", "1"], "--momentum must be in [0, 1)"),
    ],
)
def test_bad_training_settings_are_refused_with_the_flag_named(argv, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        _parse(ServerConfig, argv)


def test_expected_errors_print_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    assert cli.main(["serve", "--local-epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert "--local-epochs must be >= 1" in err and "Traceback" not in err

    def expected(args: argparse.Namespace) -> int:
        raise FedperError("the export at x has no manifest.json")

    def bug(args: argparse.Namespace) -> int:
        raise ValueError("an internal invariant broke")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda only_serve=False: parser)
    parser._subparsers._group_actions[0].choices["report"].set_defaults(run=expected)  # type: ignore[union-attr]
    assert cli.main(["report", "x"]) == 2
    assert "the export at x has no manifest.json" in capsys.readouterr().err
    parser._subparsers._group_actions[0].choices["report"].set_defaults(run=bug)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="an internal invariant broke"):
        cli.main(["report", "x"])
