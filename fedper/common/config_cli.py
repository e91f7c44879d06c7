"""Command-line options generated from config dataclasses, so each setting lives in one place.

A field's default, type and help (``field(metadata={"help": ...})``) become an
``argparse`` option named after the field (``local_epochs`` -> ``--local-epochs``);
``metadata["flags"]`` adds aliases; a ``Literal`` type (or ``metadata["choices"]``) restricts values. A field made with
``nested`` holds another config dataclass whose options join the command's own (same names, the
holder's defaults), so a setting composed into several commands is defined once.

The parsed options remember which ones the user gave (:func:`given`), so a command can bring
other defaults for the rest (:func:`with_defaults`, e.g. a dataset's paper setting) without
declaring any option again.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")
_GIVEN = "_given_options"  # where the parsed namespace keeps the names of the options given


def _note_given(namespace: argparse.Namespace, dest: str) -> None:
    vars(namespace).setdefault(_GIVEN, set()).add(dest)


class _Store(argparse.Action):
    """``store``, noting that the user gave the option."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:  # fmt: skip
        setattr(namespace, self.dest, values)
        _note_given(namespace, self.dest)


class _StoreFlag(argparse.BooleanOptionalAction):
    """``--flag/--no-flag``, noting that the user gave it."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:  # fmt: skip
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


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


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field carrying its command-line help."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def nested(factory: Callable[[], object], role: str = "") -> Any:
    """A dataclass field holding another config; ``factory`` gives the holder's defaults, ``role``
    what the holder does with them (appended to each option's help)."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True, "role": role})


def _default(f: dataclasses.Field[Any], defaults: object | None) -> Any:
    if defaults is not None:
        return getattr(defaults, f.name)
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _parse_int_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX, got {text!r}") from exc


def _parse_str_tuple(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _converter(tp: Any) -> tuple[Any, bool]:
    """(argparse type callable, optional?) for a field type."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        conv, _ = _converter(inner[0])
        return conv, True
    if origin is tuple:
        args = get_args(tp)
        if args == (int, int):
            return _parse_int_range, False
        return _parse_str_tuple, False
    if tp is Path:
        return Path, False
    if origin is Literal:
        return type(get_args(tp)[0]), False
    return tp, False


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    skip: tuple[str, ...] = (),
    defaults: object | None = None,
    role: str = "",
) -> None:
    """Add one option per field of dataclass ``cls`` (fields without help are skipped); a nested
    config's options take their defaults from the holder's instance and say its ``role``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.metadata.get("nested"):
            add_arguments(parser, hints[f.name], skip, _default(f, defaults), f.metadata["role"])
            continue
        if "help" not in f.metadata:
            continue
        flags = [f"--{f.name.replace('_', '-')}", *f.metadata.get("flags", ())]
        tp = hints[f.name]
        default = _default(f, defaults)
        shown = _show(default)
        described = f.metadata["help"] + (f", {role}" if role else "")
        help_text = described + (f" (default: {shown})" if shown != "" else "")
        if tp is bool:
            parser.add_argument(
                *flags, dest=f.name, action=_StoreFlag,
                default=default, help=described,
            )  # fmt: skip
            continue
        conv, _ = _converter(tp)
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "action": _Store,
            "type": conv,
            "default": default,
            "help": help_text,
        }
        choices = get_args(tp) if get_origin(tp) is Literal else f.metadata.get("choices")
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["metavar"] = f.metadata.get("metavar") or _metavar(conv)
        parser.add_argument(*flags, **kwargs)


def add_command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    run: Callable[[argparse.Namespace], int],
    configs: Sequence[type],
    help: str,
    description: str,
    skip: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """A subcommand whose options are the fields of ``configs`` and which calls ``run``."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    for cls in configs:
        add_arguments(parser, cls, skip)
    parser.set_defaults(run=run)
    return parser


def from_arguments(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build ``cls`` from parsed options (fields not on the command line keep their defaults)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.metadata.get("nested"):
            inner = [g.name for g in dataclasses.fields(hints[f.name])]
            if any(hasattr(args, name) for name in inner):
                values[f.name] = from_arguments(hints[f.name], args)
        elif hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    values.update(overrides)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if isinstance(values.get(f.name), list):
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def _metavar(conv: Any) -> str:
    return {
        int: "N", float: "X", str: "TEXT", Path: "PATH",
        _parse_int_range: "N|MIN-MAX", _parse_str_tuple: "A,B,...",
    }.get(conv, "VALUE")  # fmt: skip


def _show(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        if len(value) == 2 and all(isinstance(v, int) for v in value):
            return f"{value[0]}-{value[1]}"
        return ",".join(str(v) for v in value)
    return str(value)
