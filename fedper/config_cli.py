"""Command-line options generated from config dataclasses, so each setting lives in one place.

A field's default, type and help (``field(metadata={"help": ...})``) become an
``argparse`` option named after the field (``local_epochs`` -> ``--local-epochs``);
``metadata["flags"]`` adds aliases, ``metadata["choices"]`` restricts values.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

T = TypeVar("T")


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field carrying its command-line help."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


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
    return tp, False


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Add one option per field of dataclass ``cls`` (fields without help are skipped)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        flags = [f"--{f.name.replace('_', '-')}", *f.metadata.get("flags", ())]
        tp = hints[f.name]
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        shown = _show(default)
        help_text = f.metadata["help"] + (f" (default: {shown})" if shown != "" else "")
        if tp is bool:
            parser.add_argument(
                *flags, dest=f.name, action=argparse.BooleanOptionalAction,
                default=default, help=f.metadata["help"],
            )  # fmt: skip
            continue
        conv, _ = _converter(tp)
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "type": conv,
            "default": default,
            "help": help_text,
        }
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if "choices" not in f.metadata and "metavar" not in kwargs:
            kwargs["metavar"] = f.metadata.get("metavar") or _metavar(conv)
        parser.add_argument(*flags, **kwargs)


def from_arguments(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build ``cls`` from parsed options (fields not on the command line keep their defaults)."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if hasattr(args, f.name)
    }
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
