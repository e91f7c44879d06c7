"""The ``fedper`` command line: one subcommand per job, options from config dataclasses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial

from rich.console import Console
from rich.text import Text

from fedper import __version__
from fedper.common.config_cli import CommandOptions
from fedper.common.errors import FedperError

console = Console(stderr=True)
Command = Callable[[argparse.Namespace], int]


# The extra each command that needs the training stack comes with (pyproject.toml).
NEEDS_EXTRA = {"simulate": "device", "export": "export", "device": "device", "fleet": "device", "demo": "all",
               "pretrain": "device", "report": "device", "probe-check": "device"}  # fmt: skip


def build_parser(only_serve: bool = False) -> argparse.ArgumentParser:
    """Every subcommand; with ``only_serve``, just ``serve``, whose process must not import the
    training stack (torch: ~1 GB and seconds at start) that the other commands' modules import.
    Where that stack is not installed (``pip install 'fedper[server]'``), its commands are still
    listed, and say which extra they need."""
    parser = argparse.ArgumentParser(
        prog="fedper",
        description="Personalized federated learning (FedPer) for on-device models.",
    )
    parser.add_argument("--version", action="version", version=f"fedper {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from fedper.server import admin_command, serve_command

    if only_serve:
        serve_command.add_parser(sub)
        admin_command.add_parser(sub)
        return parser
    try:
        from fedper._recipes import demo_command, pretrain_command, probe_check, report_command, simulate_command
        from fedper.device_runtime import commands as device_commands
        from fedper.device_runtime.training_program import check_exported
        from fedper.export import export_command
    except ModuleNotFoundError as exc:
        if (exc.name or "fedper").split(".")[0] == "fedper":
            raise
        _add_uninstalled(sub, exc.name or "", serve_command.add_parser, admin_command.add_parser)
        return parser

    simulate_command.add_parser(sub)
    export_command.add_parser(sub)
    # The export is checked with the runtime a device uses: composed here, not imported by export.
    sub.choices["export"].set_defaults(check=check_exported)
    serve_command.add_parser(sub)
    admin_command.add_parser(sub)
    device_commands.add_parsers(sub)
    demo_command.add_parser(sub)
    pretrain_command.add_parser(sub)
    report_command.add_parser(sub)
    probe_check.add_parser(sub)
    return parser


def _add_uninstalled(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    missing: str,
    *installed: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
) -> None:
    """``serve`` and ``admin``, and in their place the commands whose modules import ``missing``:
    each accepts any arguments (``main`` does not refuse them) and fails with the extra to install."""
    for name, extra in NEEDS_EXTRA.items():
        command = sub.add_parser(name, help=f"not installed: needs {missing} (pip install 'fedper[{extra}]')")
        message = f"`fedper {name}` needs {missing}, which is not installed: pip install 'fedper[{extra}]'"
        command.set_defaults(run=partial(_uninstalled, message), any_arguments=True)
    for add_parser in installed:
        add_parser(sub)


def _uninstalled(message: str, _args: argparse.Namespace) -> int:
    raise FedperError(message)


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The command ``argv`` names (``run``) and its options: argparse finds the command, tyro
    parses its options (``--help`` and bad options exit, as argparse does)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only_serve=command in ("serve", "admin"))
    args, rest = parser.parse_known_args(argv)
    options: CommandOptions | None = getattr(args, "options", None)
    if options is not None:
        return argparse.Namespace(**{**vars(args), **vars(options.parse(rest))})
    if rest and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. An expected failure prints one line and exits 2: a :class:`FedperError`
    (bad option or input file, a refused request, an unreachable server) or an ``OSError`` (a
    missing file, no permission, a full disk: the message names the path). Anything else is a
    bug and keeps its traceback."""
    try:
        args = parse_arguments(list(sys.argv[1:] if argv is None else argv))
        run: Command = args.run
        return run(args)
    except (FedperError, OSError) as exc:
        # Not markup (a message may hold brackets), not wrapped (logs keep one line per error).
        console.print(Text.assemble(("error: ", "bold red"), str(exc)), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
