"""The command line's contract: one training config composed everywhere, and errors that are
one line when expected and a traceback when they are bugs."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import typing
from dataclasses import replace
from importlib import metadata

import pytest

from fedper import cli
from fedper._recipes.demo_config import DemoConfig
from fedper._recipes.pretrain import PretrainConfig
from fedper._recipes.simulation import SimulationConfig, model_config
from fedper.common.config_cli import from_arguments, given, option, parse, with_defaults
from fedper.common.errors import ConfigError, FedperError
from fedper.common.manifest import TrainingDefaults
from fedper.common.protocol import TaskConfig
from fedper.common.train_config import TrainConfig
from fedper.export.pipeline import ExportConfig
from fedper.models import ModelConfig
from fedper.results import config_json
from fedper.server.config import ServerConfig

HOLDERS = [ServerConfig, ExportConfig, SimulationConfig, DemoConfig]


def _parse(cls: type, argv: list[str]) -> object:
    return from_arguments(cls, parse([cls], argv, "test"))


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda c: c.__name__)
def test_every_command_takes_the_training_settings_from_the_one_config(holder):
    config = _parse(holder, ["--local-epochs", "4", "--lr", "0.05", "--batch-size", "16", "--momentum", "0.5"])
    assert config.training == TrainConfig(local_epochs=4, batch_size=16, learning_rate=0.05, momentum=0.5)
    # No holder declares a training setting of its own beside the composed one.
    names = {f.name for f in dataclasses.fields(holder)}
    assert not names & {f.name for f in dataclasses.fields(TrainConfig)}


MODEL_HOLDERS = [SimulationConfig, ExportConfig, PretrainConfig, DemoConfig]


@pytest.mark.parametrize("holder", MODEL_HOLDERS, ids=lambda c: c.__name__)
def test_every_command_takes_the_model_settings_from_the_one_config(holder):
    hints = typing.get_type_hints(holder)
    nested_models = [f for f in dataclasses.fields(holder) if hints[f.name] is ModelConfig]
    assert len(nested_models) == 1 and nested_models[0].metadata.get("nested")
    # No holder declares a model setting of its own beside the composed one, by field or by flag.
    own = {f.name for f in dataclasses.fields(holder)} - {nested_models[0].name}
    assert not own & {"model", "alpha", "head", "base", "input_size", "num_classes"}
    parsed = from_arguments(holder, parse([holder], [], "test"))
    assert parsed.model == holder().model  # the command line shows the holder's defaults


def test_the_model_flags_keep_their_names_and_each_commands_defaults():
    simulate = from_arguments(
        SimulationConfig,
        parse(
            [SimulationConfig], ["--model", "resnet34", "--alpha", "0.5", "--base", "linear", "--init", "scratch"], "t"
        ),
    )
    assert simulate.model == ModelConfig(name="resnet34", alpha=0.5, base="linear")
    # The data sets the simulation's classes and input size, its --kp the linear base's layers.
    assert model_config(simulate, 5, 64) == ModelConfig("resnet34", 5, 0.5, 64, "linear", simulate.kp)
    export = from_arguments(ExportConfig, parse([ExportConfig], ["--num-classes", "3", "--input-size", "64"], "t"))
    assert export.model == ModelConfig(num_classes=3, input_size=64)
    pretrain = from_arguments(PretrainConfig, parse([PretrainConfig], ["--alpha", "1.0"], "t"))
    assert pretrain.model == replace(PretrainConfig().model, alpha=1.0) and pretrain.model.num_classes > 10
    assert (DemoConfig().model.head, DemoConfig().model.num_classes) == ("ordinal", 5)
    # What a command sets itself is no option of it: the demo's width, the simulation's classes.
    for holder, absent in [(DemoConfig, "--alpha"), (SimulationConfig, "--num-classes"), (PretrainConfig, "--head"),
                           (ExportConfig, "--base"), (SimulationConfig, "--name")]:  # fmt: skip
        with pytest.raises(SystemExit):
            parse([holder], [absent, "1"], "test")
    # results.json's config keeps the flags' names, flat, without the fields a command sets itself.
    recorded = config_json(simulate)
    assert (recorded["model"], recorded["alpha"], recorded["base"]) == ("resnet34", 0.5, "linear")
    assert not {"name", "num_classes", "input_size", "linear_base_kp"} & set(recorded)


def test_defaults_live_in_one_place_and_recipes_override_them_by_name():
    base = TrainConfig()
    assert ServerConfig().training == base and ExportConfig().training == base
    # The manifest's defaults are that config (its fields, defaults and checks), and the task's
    # overrides are its fields, each optional on the wire.
    assert isinstance(TrainingDefaults(), TrainConfig)
    assert TrainConfig(**{f.name: getattr(TrainingDefaults(), f.name) for f in dataclasses.fields(base)}) == base
    assert TaskConfig.asking(base).over(TrainingDefaults(local_epochs=5)) == TrainingDefaults()
    for f in dataclasses.fields(TrainConfig):
        assert TaskConfig.model_fields[f.name].annotation == (typing.get_type_hints(TrainConfig)[f.name] | None)
    assert set(TaskConfig.model_fields) == {f.name for f in dataclasses.fields(TrainConfig)}
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


def _parse_args(argv: list[str]) -> argparse.Namespace:
    return parse([SimulationConfig], argv, "test")


def test_the_options_given_are_told_apart_from_defaults():
    args = _parse_args(["--batch-size", "32", "--rounds=3"])
    assert given(args) == {"batch_size", "rounds"}  # --batch-size 32 is given even though 32 is its default
    assert given(_parse_args([])) == frozenset()
    assert given(_parse_args(["--algorithms", "fedper"])) == {"algorithms"}


def test_other_defaults_fill_only_the_options_not_given():
    args = with_defaults(_parse_args(["--batch-size", "32"]), {"batch_size": 4, "rounds": 35, "alpha": 1.0})
    sim = from_arguments(SimulationConfig, args)
    assert sim.training.batch_size == 32 and sim.rounds == 35 and sim.model.alpha == 1.0
    # A nested config keeps its holder's defaults where neither the user nor the table set one.
    assert sim.training.local_epochs == SimulationConfig().training.local_epochs
    assert given(args) == {"batch_size"}


def test_a_defaults_table_naming_no_option_or_the_wrong_type_is_refused():
    with pytest.raises(KeyError, match="'image_size' is not an option"):
        with_defaults(_parse_args([]), {"image_size": 224})
    with pytest.raises(TypeError, match="--rounds is '35', expected a int"):
        with_defaults(_parse_args([]), {"rounds": "35"})


@dataclasses.dataclass(frozen=True)
class _Flags:
    verbose: bool = option(False, "say more")


def test_a_boolean_flag_is_given_whichever_way_it_is_set():
    assert given(parse([_Flags], ["--no-verbose"], "test")) == {"verbose"}
    assert (
        from_arguments(_Flags, with_defaults(parse([_Flags], ["--no-verbose"], "test"), {"verbose": True})) == _Flags()
    )
    assert from_arguments(_Flags, with_defaults(parse([_Flags], [], "test"), {"verbose": True})) == _Flags(verbose=True)


def test_a_task_overrides_the_manifests_defaults_key_by_key_and_is_checked_as_they_are():
    defaults = TrainingDefaults(batch_size=16, trainable="head")
    assert TaskConfig().over(defaults) == defaults  # an absent key keeps the manifest's default
    assert TaskConfig(local_epochs=3).over(defaults) == dataclasses.replace(defaults, local_epochs=3)
    # A key a newer server adds is compatible (PROTOCOL.md): kept on the model, not applied.
    newer = TaskConfig.model_validate({"momentum": 0.5, "warmup_steps": 10})
    assert newer.over(defaults) == dataclasses.replace(defaults, momentum=0.5)
    with pytest.raises(ValueError, match="--batch-size must be >= 2"):
        TaskConfig(batch_size=1).over(defaults)


def test_the_servers_settings_come_from_a_flag_then_a_fedper_variable_then_the_default(monkeypatch):
    monkeypatch.setenv("FEDPER_ROUNDS", "7")
    monkeypatch.setenv("FEDPER_CLIP_FACTOR", "0")  # nested configs' options are flat, as flags are
    monkeypatch.setenv("fedper_local_epochs", "3")  # as pydantic-settings reads them: any case
    config = from_arguments(ServerConfig, cli.parse_arguments(["serve", "--rounds", "9"]))
    assert (config.rounds, config.aggregation.clip_factor, config.training.local_epochs) == (9, 0.0, 3)
    assert config.port == ServerConfig().port
    # Only the server reads them: a simulation's --rounds is its own.
    assert from_arguments(SimulationConfig, cli.parse_arguments(["simulate"])).rounds == SimulationConfig().rounds
    monkeypatch.setenv("FEDPER_AGGREGATE", "max")
    with pytest.raises(
        ConfigError, match="FEDPER_AGGREGATE: Input should be 'mean', 'median', 'trimmed-mean' or 'centered-clip'"
    ):
        cli.parse_arguments(["serve"])
    assert cli.main(["serve"]) == 2  # one line, no traceback


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_every_extra_a_command_asks_for_is_one_the_package_provides():
    assert set(cli.NEEDS_EXTRA.values()) <= set(cli.extra_packages())
    assert set(cli.NEEDS_EXTRA) == _commands(cli.build_parser()) - {"serve", "admin"}


def test_the_extras_are_read_from_the_metadata_as_packaging_reads_them():
    """Each extra installs its own requirements and those of the fedper extras it names, as
    ``packaging`` parses the installed package's Requires-Dist (the CLI reads them without it)."""
    requirements = pytest.importorskip("packaging.requirements")
    canonical = pytest.importorskip("packaging.utils").canonicalize_name
    dist = metadata.distribution("fedper")
    packages = cli.extra_packages()
    assert set(packages) == set(dist.metadata.get_all("Provides-Extra"))
    for extra in packages:
        expected: set[str] = set()
        for line in dist.requires or []:
            req = requirements.Requirement(line)
            if req.marker is None or not req.marker.evaluate({"extra": extra}):
                continue
            if canonical(req.name) == "fedper":
                expected |= set().union(*(packages[e] for e in req.extras))
            else:
                expected.add(canonical(req.name))
        assert packages[extra] == expected, extra
    assert "torch" in packages["device"] and "onnx" not in packages["device"]


def test_a_command_asks_for_the_extra_that_installs_what_is_missing(monkeypatch):
    assert cli.extra_to_install("simulate", "torch") == "device"
    assert cli.extra_to_install("export", "torch.nn") == "export"
    assert cli.extra_to_install("demo", "torch") == "all"
    # onnx is export's (and demo's, which exports): the extra that installs both.
    assert cli.extra_to_install("export", "onnx") == "export"
    assert cli.extra_to_install("demo", "onnx") == "all"
    assert cli.extra_to_install("simulate", "onnx") == "export"
    assert cli.extra_to_install("device", "PIL") == "device"  # an import name that is no distribution's
    monkeypatch.setattr(metadata, "distribution", lambda _name: (_ for _ in ()).throw(metadata.PackageNotFoundError))
    assert cli.extra_packages() == {} and cli.extra_to_install("simulate", "onnx") == "device"


def test_an_uninstalled_command_takes_any_arguments_and_names_its_extra():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli._add_uninstalled(sub, "torch", cli.NEEDS_EXTRA)
    args, _rest = parser.parse_known_args(["demo", "--devices", "3"])
    with pytest.raises(
        FedperError, match=r"`fedper demo` needs torch, which is not installed: pip install 'fedper\[all\]'"
    ):
        args.run(args)


@pytest.mark.slow
def test_a_command_whose_extra_is_not_installed_says_which_to_install():
    """Without the export's onnx (a device-only install: a board, make arm-check's aarch64 root),
    every command but ``export`` and ``demo`` runs; those two say what to install."""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        blocked = f"import sys; sys.modules['onnx'] = None; from fedper.cli import main; sys.exit(main({list(argv)!r}))"
        return subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, env=os.environ,
                              timeout=300)  # fmt: skip

    done = run("export", "-x")
    assert done.returncode == 2, done.stderr
    assert "`fedper export` needs onnx, which is not installed: pip install 'fedper[export]'" in done.stderr
    done = run("demo")
    assert done.returncode == 2 and "`fedper demo` needs onnx" in done.stderr and "fedper[all]" in done.stderr
    for command in ("device", "fleet", "simulate"):
        done = run(command, "--help")
        assert done.returncode == 0 and "not installed" not in done.stdout + done.stderr, (command, done.stderr)
