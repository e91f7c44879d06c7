"""Every command's flags, choices and defaults, held to the record made before the command line
moved to tyro (``tests/data/cli_options.json``: argparse's own view of each option of fedper
7285303, with one argv per flag and the value argparse parsed it to). A change to an option is
a change to this record, made on purpose.

Each recorded flag is replayed through ``fedper.cli.parse_arguments``, which finds the command
and lets tyro parse its options: the same value must come out, the defaults must be the same,
and no command may have gained a flag the record lacks."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedper.cli import parse_arguments
from fedper.common.config_cli import CommandOptions

RECORD = json.loads((Path(__file__).resolve().parents[2] / "data" / "cli_options.json").read_text())


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, int | float | str | bool) else str(value)


def _parsed(parse: Callable[[list[str]], Any], argv: list[str]) -> Any:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return parse(argv)
        except SystemExit:
            return None


@pytest.mark.parametrize("command", list(RECORD))
def test_a_commands_flags_and_defaults_are_the_recorded_ones(command: str) -> None:
    spec = RECORD[command]
    defaults = _parsed(parse_arguments, [*command.split(), *spec["base"]])
    assert defaults is not None
    options: CommandOptions = defaults.options  # the command's own parser: the trials skip finding it
    flags = options.flags()
    recorded = {flag for entry in spec["options"] for flag in entry["flags"]}
    assert flags == {f for f in recorded if not (f.startswith("--no-") and f"--{f[5:]}" in recorded)}
    for entry in spec["options"]:
        assert _plain(getattr(defaults, entry["dest"])) == entry["default"], entry["dest"]
        for argv, value in entry["trials"]:
            parsed = _parsed(options.parse, spec["base"] + argv)
            assert (None if parsed is None else _plain(getattr(parsed, entry["dest"]))) == value, argv
