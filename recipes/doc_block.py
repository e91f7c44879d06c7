"""Generated tables live in the docs between two marker comments; this replaces what is between."""

from __future__ import annotations

from pathlib import Path

from fedper.common.atomic_write import atomic_write_text
from fedper.common.errors import FedperError


def write_block(doc: Path, begin: str, end: str, text: str) -> None:
    """Replace the block between the ``begin`` and ``end`` markers in ``doc`` with ``text``."""
    content = doc.read_text()
    if begin not in content or end not in content:
        raise FedperError(f"{doc} has no '{begin}' ... '{end}' block to replace")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    atomic_write_text(doc, f"{head}{begin}\n{text}\n{end}{tail}")
