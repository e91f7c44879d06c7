"""JSON as the protocol accepts it: no stricter parser than the one that later reads it back.

Python's ``json`` accepts what other parsers refuse (the safetensors library, SQLite's text,
a device's JSON library): ``NaN``/``Infinity``, ``1e999`` (becomes inf), duplicate keys (the
last wins), integers of thousands of digits (``ValueError`` past 4300), nesting until
``RecursionError``, and ``\\ud800`` escapes that decode to lone surrogates. Each is refused
here with a :class:`JsonError` saying what was wrong.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32
MAX_INTEGER_DIGITS = 20  # 2^64 has 20 digits: no count, offset or size needs more
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # the only way one gets past strict UTF-8


class JsonError(ValueError):
    """The bytes are not JSON as the protocol defines it."""


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise JsonError(f"an integer of {len(text)} digits (at most {MAX_INTEGER_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonError(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise JsonError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonError(f"duplicate key {key[:64]!r}")
        out[key] = value
    return out


def _check_tree(value: Any, strings: bool) -> None:
    """Depth, and with ``strings`` Unicode, iteratively (the tree may be deep: that is what is
    being checked)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if strings and _SURROGATE.search(item):
                raise JsonError("a string holds a lone surrogate (\\ud800-\\udfff): not valid Unicode")
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise JsonError(f"nested deeper than {MAX_DEPTH} levels")
            children = list(item.items()) if isinstance(item, dict) else [(None, v) for v in item]
            for key, child in children:
                if key is not None:
                    stack.append((key, depth + 1))
                stack.append((child, depth + 1))


def loads(data: bytes) -> Any:
    """The JSON value in ``data`` (UTF-8), or a JsonError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonError(f"not valid UTF-8 at byte {exc.start}") from exc
    try:
        value = json.loads(
            text, parse_int=_integer, parse_float=_float, parse_constant=_constant, object_pairs_hook=_object
        )
    except RecursionError as exc:
        raise JsonError(f"nested deeper than {MAX_DEPTH} levels") from exc
    except json.JSONDecodeError as exc:
        raise JsonError(f"not JSON: {exc}") from exc
    except ValueError as exc:  # JsonError from a hook, or int() refusing what the hooks let by
        raise JsonError(str(exc)) from exc
    _check_tree(value, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value
