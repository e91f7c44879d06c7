"""The ``fedper`` command line: one subcommand per job, options from config dataclasses."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from importlib import metadata

from rich.console import Console
from rich.text import Text

from fedper import __version__
from fedper.common.config_cli import CommandOptions
from fedper.common.errors import FedperError

console = Console(stderr=True)
Command = Callable[[argparse.Namespace], int]


# The extra each command that needs the training stack comes with; which packages an extra
# installs, pyproject.toml says (read back from the installed package: extra_packages).
NEEDS_EXTRA = {"simulate": "device", "export": "export", "device": "device", "fleet": "device", "demo": "all",
               "pretrain": "device", "report": "device", "probe-check": "device"}  # fmt: skip
# A Requires-Dist line's name and extras, and its marker's extra (PEP 508). Read without
# ``packaging``: neither the core nor the server extra installs it, and a server-only install is
# where these lines are read.
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"\bextra\s*==\s*['\"]([^'\"]+)['\"]")


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
        from fedper._recipes import pretrain_command, probe_check, report_command, simulate_command
        from fedper.device_runtime import commands as device_commands
        from fedper.device_runtime.training_program import check_exported
    except ModuleNotFoundError as exc:
        if (exc.name or "fedper").split(".")[0] == "fedper":
            raise
        _add_uninstalled(sub, exc.name or "", NEEDS_EXTRA, serve_command.add_parser, admin_command.add_parser)
        return parser
    # The export's own tools (onnx) are not a device's: a device-only install (a board, an ARM
    # device) runs every command but these two, which say what to install.
    exporting: ModuleNotFoundError | None = None
    try:
        from fedper._recipes import demo_command
        from fedper.export import export_command
    except ModuleNotFoundError as exc:
        if (exc.name or "fedper").split(".")[0] == "fedper":
            raise
        exporting = exc
    simulate_command.add_parser(sub)
    if exporting is None:
        export_command.add_parser(sub)
        # The export is checked with the runtime a device uses: composed here, not imported by export.
        sub.choices["export"].set_defaults(check=check_exported)
    else:
        _add_uninstalled(sub, exporting.name or "", ("export",))
    serve_command.add_parser(sub)
    admin_command.add_parser(sub)
    device_commands.add_parsers(sub)
    if exporting is None:
        demo_command.add_parser(sub)
    else:
        _add_uninstalled(sub, exporting.name or "", ("demo",))
    pretrain_command.add_parser(sub)
    report_command.add_parser(sub)
    probe_check.add_parser(sub)
    return parser


def _canonical(name: str) -> str:
    """A distribution's name as package indexes compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_packages() -> dict[str, frozenset[str]]:
    """Each extra of the installed fedper and the distributions it installs: its own and those of
    the fedper extras it names (``export = ["fedper[device]", ...]``), from the package metadata;
    empty where fedper is not installed (a source tree on the path)."""
    try:
        dist = metadata.distribution("fedper")
    except metadata.PackageNotFoundError:
        return {}
    own: dict[str, set[str]] = {extra: set() for extra in dist.metadata.get_all("Provides-Extra") or []}
    names: dict[str, set[str]] = {extra: set() for extra in own}
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        extra, parsed = _EXTRA_MARKER.search(marker), _REQUIREMENT.match(requirement)
        if extra is None or parsed is None or extra[1] not in own:
            continue
        name, extras = parsed.groups()
        if _canonical(name) == "fedper":
            names[extra[1]] |= {e.strip() for e in (extras or "").split(",") if e.strip()}
        else:
            own[extra[1]].add(_canonical(name))

    def installs(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
        inner = [installs(e, seen | {extra}) for e in names[extra] if e in own and e not in seen]
        return own[extra].union(*inner)

    return {extra: frozenset(installs(extra)) for extra in own}


def extra_to_install(command: str, missing: str) -> str:
    """The extra ``fedper {command}`` asks for when module ``missing`` is not installed: its own,
    unless that does not install ``missing`` (every command's modules are imported together, so
    a module of another extra stops them all): then the smallest extra that installs both."""
    own = NEEDS_EXTRA[command]
    packages = extra_packages()
    wanted = _canonical(missing.split(".")[0])
    if own not in packages or wanted in packages[own]:
        return own
    both = [extra for extra, names in packages.items() if wanted in names and packages[own] <= names]
    return min(both, key=lambda extra: (len(packages[extra]), extra), default=own)


def _add_uninstalled(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    missing: str,
    names: Iterable[str],
    *installed: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
) -> None:
    """In place of the commands ``names``, whose modules import ``missing``, a command that
    accepts any arguments (``main`` does not refuse them) and fails with the extra to install;
    then the commands ``installed`` adds."""
    for name in names:
        extra = extra_to_install(name, missing)
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
