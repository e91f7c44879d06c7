"""Command-line options from config dataclasses, parsed by tyro, so each setting lives in one place.

A field's default, type and help (``field(metadata={"help": ...})``, which tyro reads) become an
option named after the field (``local_epochs`` -> ``--local-epochs``) or ``metadata["name"]``;
``metadata["flags"]`` adds aliases, ``metadata["metavar"]`` names the value, ``metadata["repeatable"]``
makes a tuple option one given once per value; a ``Literal`` type
restricts the values (tyro lists them). A field made with :func:`nested` holds another config
whose options join the command's own (same names, the holder's defaults, the fields the holder
skips left out), so a setting composed into several commands is defined once.

What is written here rather than taken from tyro, and why: a command's options are the fields of
*several* configs with some left out (``skip``: ``fedper fleet`` has ``--devices``, not the data
config's ``--clients``), which tyro's nesting cannot say, so the configs are flattened into one
dataclass for tyro; the two value syntaxes older than this module (``--images-per-user 100-200``,
``--algorithms fedper,fedavg``) are tyro constructors. The parsed options remember which ones the
user gave (:func:`given`), so a command can bring other defaults for the rest
(:func:`with_defaults`, e.g. a dataset's paper setting).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import tyro
from tyro.constructors import PrimitiveConstructorSpec

from fedper.common.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
_GIVEN = "_given_options"  # where the parsed namespace keeps the names of the options given


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field carrying its command-line help (``name=``: the option's name, where the
    field's own would read wrong on the command line)."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def nested(factory: Callable[[], object], role: str = "", skip: tuple[str, ...] = ()) -> Any:
    """A dataclass field holding another config; ``factory`` gives the holder's defaults, ``role``
    what the holder does with them (appended to each option's help), ``skip`` the fields that are
    not options of the holder (it sets them itself: they keep ``factory``'s values)."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True, "role": role, "skip": skip})


def _name(f: dataclasses.Field[Any]) -> str:
    """The option (and parsed attribute) a field is."""
    name: str = f.metadata.get("name", f.name)
    return name


@dataclasses.dataclass(frozen=True)
class Positional:
    """A positional argument of a command (not a config setting: what the command acts on)."""

    name: str
    type: Any
    metavar: str
    help: str


@dataclasses.dataclass(frozen=True)
class _Option:
    name: str
    type: Any  # annotated for tyro
    default: Any
    flags: tuple[str, ...]


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError as exc:
        raise ValueError(f"expected N or MIN-MAX, got {text!r}") from exc


def _names(text: str) -> tuple[str, ...]:
    return tuple(s for s in map(str.strip, text.split(",")) if s)


# ``--images-per-user 100-200`` and ``--algorithms fedper,fedavg``: one word each, as before tyro.
_RANGE = PrimitiveConstructorSpec(
    nargs=1, metavar="N|MIN-MAX", instance_from_str=lambda args: _range(args[0]),
    is_instance=lambda v: isinstance(v, tuple) and len(v) == 2, str_from_instance=lambda v: [f"{v[0]}-{v[1]}"],
)  # fmt: skip
_NAMES = PrimitiveConstructorSpec(
    nargs=1, metavar="A,B,...", instance_from_str=lambda args: _names(args[0]),
    is_instance=lambda v: isinstance(v, tuple), str_from_instance=lambda v: [",".join(str(s) for s in v)],
)  # fmt: skip
_METAVARS: dict[Any, str] = {int: "N", float: "X", str: "TEXT", Path: "PATH"}


def _default(f: dataclasses.Field[Any], defaults: object | None) -> Any:
    if defaults is not None:
        return getattr(defaults, f.name)
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _annotated(tp: Any, f: dataclasses.Field[Any], help: str) -> Any:
    """The field's type with what tyro needs to show and parse it as this module's options do.
    A ``repeatable`` field's option is given once per value (``--model-arg a=1 --model-arg b=2``)
    and parsed as the words given, which the config's ``__post_init__`` reads into its own type."""
    if f.metadata.get("repeatable"):
        arg = tyro.conf.arg(help=help, metavar=f.metadata.get("metavar") or "TEXT")
        return Annotated[tuple[str, ...], tyro.conf.UseAppendAction, arg]
    optional = get_origin(tp) in (Union, types.UnionType)
    base = next(a for a in get_args(tp) if a is not type(None)) if optional else tp
    markers: list[Any] = []
    if get_origin(base) is tuple:
        markers.append(_RANGE if get_args(base) == (int, int) else _NAMES)
    metavar = f.metadata.get("metavar") or (None if get_origin(tp) is Literal or base is bool else _METAVARS.get(base))
    markers.append(tyro.conf.arg(help=help, aliases=tuple(f.metadata.get("flags", ())) or None, metavar=metavar))
    return Annotated[tp, *markers]


def _options(cls: type, skip: tuple[str, ...], defaults: object | None = None, role: str = "") -> list[_Option]:
    """One option per field of dataclass ``cls`` (fields without help are skipped); a nested
    config's options take their defaults from the holder's instance and say its ``role``."""
    hints = typing.get_type_hints(cls)
    out: list[_Option] = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.metadata.get("nested"):
            inner = (*skip, *f.metadata["skip"])
            out += _options(hints[f.name], inner, _default(f, defaults), f.metadata["role"])
        elif "help" in f.metadata:
            help = f.metadata["help"] + (f", {role}" if role else "")
            flags = (f"--{_name(f).replace('_', '-')}", *f.metadata.get("flags", ()))
            out.append(_Option(_name(f), _annotated(hints[f.name], f, help), _default(f, defaults), flags))
    return out


@dataclasses.dataclass(frozen=True)
class CommandOptions:
    """A command's options: the fields of its ``configs`` but ``skip``, then its positionals."""

    prog: str
    description: str
    configs: Sequence[type[DataclassInstance]]
    skip: tuple[str, ...] = ()
    positionals: Sequence[Positional] = ()
    env_prefix: str = ""  # set: each option's default comes from PREFIX<OPTION> where that is set

    def flags(self) -> set[str]:
        """Every flag of the command's options (aliases included, ``--no-`` forms not)."""
        return {flag for cls in self.configs for o in _options(cls, self.skip) for flag in o.flags}

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The options in ``argv`` (``--help`` prints them and exits), with :func:`given` known."""
        options = [o for cls in self.configs for o in _options(cls, self.skip)]
        if self.env_prefix:
            options = _from_environment(options, self.env_prefix)
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
            (p.name, Annotated[p.type, tyro.conf.Positional, tyro.conf.arg(metavar=p.metavar, help=p.help)])
            for p in self.positionals
        ]
        fields += [(o.name, o.type, dataclasses.field(default=o.default)) for o in options]
        flat = dataclasses.make_dataclass("Options", fields, frozen=True)
        parsed: Any = tyro.cli(flat, args=list(argv), prog=self.prog, description=self.description)
        namespace = argparse.Namespace(**{name: getattr(parsed, name) for name, *_ in fields})
        setattr(namespace, _GIVEN, frozenset(o.name for o in options if _written(o, argv)))
        return namespace


def _from_environment(options: list[_Option], prefix: str) -> list[_Option]:
    """The options, with their defaults from the ``PREFIX<NAME>`` environment variables that are
    set (read and checked by pydantic-settings; a flag still wins)."""
    from pydantic import ValidationError, create_model
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Environment(BaseSettings):
        model_config = SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True)

    fields: dict[str, Any] = {o.name: (get_args(o.type)[0], o.default) for o in options}
    try:
        found = create_model("Environment", __base__=Environment, **fields)()
    except ValidationError as exc:
        error = exc.errors()[0]
        variable = f"{prefix}{str(error['loc'][0]).upper()}"
        raise ConfigError(f"{variable}: {error['msg']}, got {error['input']!r}") from exc
    given = found.model_fields_set
    return [dataclasses.replace(o, default=getattr(found, o.name)) if o.name in given else o for o in options]


def _written(option: _Option, argv: Sequence[str]) -> bool:
    """Whether ``argv`` sets ``option`` (tyro takes no abbreviation: a flag is written whole)."""
    names = {*option.flags, *(f"--no-{flag[2:]}" for flag in option.flags)}
    return any(arg.split("=", 1)[0] in names for arg in argv if arg.startswith("--"))


def parse(configs: Sequence[type[DataclassInstance]], argv: Sequence[str], prog: str, description: str = "",
          skip: tuple[str, ...] = ()) -> argparse.Namespace:  # fmt: skip
    """The options of ``configs`` in ``argv``: what a script that is not a ``fedper`` command uses."""
    return CommandOptions(prog, description, configs, skip).parse(argv)


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    run: Callable[[argparse.Namespace], int],
    configs: Sequence[type[DataclassInstance]],
    help: str,
    description: str,
    skip: tuple[str, ...] = (),
    positionals: Sequence[Positional] = (),
    env_prefix: str = "",
) -> argparse.ArgumentParser:
    """A subcommand whose options are the fields of ``configs`` and which calls ``run``: the
    command line (``fedper.cli.main``) finds the command, then tyro parses the rest."""
    parser = sub.add_parser(name, help=help, description=description, add_help=False)
    options = CommandOptions(parser.prog, description, configs, skip, positionals, env_prefix)
    parser.set_defaults(run=run, options=options)
    return parser


def given(args: argparse.Namespace) -> frozenset[str]:
    """The options (field names) the user put on the command line; the others hold defaults."""
    return frozenset(vars(args).get(_GIVEN, ()))


def with_defaults(args: argparse.Namespace, defaults: Mapping[str, object]) -> argparse.Namespace:
    """``args`` with ``defaults`` (field name -> value) for the options the user did not give.

    A name that is not an option of the command, or a value of another type than the option's
    own default, is a bug in the caller's table and raises (``KeyError``, ``TypeError``).
    """
    out = argparse.Namespace(**vars(args))
    for name, value in defaults.items():
        if name == _GIVEN or not hasattr(args, name):
            raise KeyError(f"{name!r} is not an option of this command")
        current = getattr(args, name)
        if current is not None and type(value) is not type(current):
            raise TypeError(f"default for --{name.replace('_', '-')} is {value!r}, expected a {type(current).__name__}")
        if name not in given(args):
            setattr(out, name, value)
    return out


def from_arguments(
    cls: type[T], args: argparse.Namespace, defaults: object | None = None, skip: tuple[str, ...] = ()
) -> T:
    """Build config ``cls`` from parsed options; a field that is not an option of the command (left
    out by ``skip``) keeps its default: ``defaults``'s value, or the holder's for a nested config."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            values[f.name] = from_arguments(hints[f.name], args, _default(f, defaults), f.metadata["skip"])
        elif f.name not in skip and hasattr(args, _name(f)):
            values[f.name] = getattr(args, _name(f))
        elif defaults is not None:
            values[f.name] = getattr(defaults, f.name)
    return cls(**values)


def option_values(config: DataclassInstance) -> dict[str, Any]:
    """A config's values by option name, a nested config's beside its holder's (but the fields
    the holder skips, which it sets itself): the settings as the command line gives them."""
    values: dict[str, Any] = {}

    def add(config: DataclassInstance, skip: tuple[str, ...]) -> None:
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name in skip:
                continue
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                add(value, f.metadata.get("skip", ()))
            else:
                values[_name(f)] = value

    add(config, ())
    return values
