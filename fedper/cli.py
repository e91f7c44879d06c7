"""The ``fedper`` command line: one subcommand per job, options from config dataclasses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from fedper import __version__

console = Console(stderr=True)
Command = Callable[[argparse.Namespace], int]


def _simulate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from device_runtime.simulation import SimulationConfig
    from fedper.config_cli import add_arguments
    from fedper.data import DataConfig

    p = sub.add_parser(
        "simulate",
        help="compare FedPer, FedAvg and local training in one process",
        description="In-process simulation (eager PyTorch) of FedPer vs FedAvg vs local training. "
        "Writes results.json, metrics.csv, plots and final weights into --out.",
    )
    add_arguments(p, DataConfig)
    add_arguments(p, SimulationConfig)
    p.set_defaults(run=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from device_runtime.simulate_command import simulate

    return simulate(args)


def build_parser(only_serve: bool = False) -> argparse.ArgumentParser:
    """Every subcommand; with ``only_serve``, just ``serve``, whose process must not import the
    training stack (torch: ~1 GB and seconds at start) that the other commands' options pull in."""
    parser = argparse.ArgumentParser(
        prog="fedper",
        description="Personalized federated learning (FedPer) for on-device models.",
    )
    parser.add_argument("--version", action="version", version=f"fedper {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if only_serve:
        from server import serve_command as serve_only

        serve_only.add_parser(sub)
        return parser
    _simulate_parser(sub)
    from device_runtime import commands as device_commands
    from device_runtime.training_program import check_exported
    from export import export_command
    from fedper import report_command
    from server import serve_command

    export_command.add_parser(sub)
    # The export is checked with the runtime a device uses: composed here, not imported by export.
    sub.choices["export"].set_defaults(check=check_exported)
    serve_command.add_parser(sub)
    device_commands.add_parsers(sub)
    report_command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only_serve=command == "serve")
    args = parser.parse_args(argv)
    run: Command = args.run
    try:
        return run(args)
    except (ValueError, OSError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
