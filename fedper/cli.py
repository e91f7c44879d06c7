"""The ``fedper`` command line: one subcommand per job, options from config dataclasses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.text import Text

from fedper import __version__
from fedper.errors import FedperError

console = Console(stderr=True)
Command = Callable[[argparse.Namespace], int]


def build_parser(only_serve: bool = False) -> argparse.ArgumentParser:
    """Every subcommand; with ``only_serve``, just ``serve``, whose process must not import the
    training stack (torch: ~1 GB and seconds at start) that the other commands' modules import."""
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
    from fedper._recipes import demo_command, pretrain_command, probe_check, report_command, simulate_command
    from fedper.device_runtime import commands as device_commands
    from fedper.device_runtime.training_program import check_exported
    from fedper.export import export_command

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. An expected failure prints one line and exits 2: a :class:`FedperError`
    (bad option or input file, a refused request, an unreachable server) or an ``OSError`` (a
    missing file, no permission, a full disk: the message names the path). Anything else is a
    bug and keeps its traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only_serve=command in ("serve", "admin"))
    args = parser.parse_args(argv)
    run: Command = args.run
    try:
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
