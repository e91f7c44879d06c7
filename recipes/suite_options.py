"""The command line every suite of ``fedper`` runs shares (``make results``, ``make
dp-results``, ...): where its runs go (finished ones are reused), runs at a time, the
``fedper`` command and the markdown file whose generated block it replaces."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def suite_parser(
    module: str, description: str | None, out: Path, block: str, jobs: bool = True
) -> argparse.ArgumentParser:
    """``python -m fedper._recipes.MODULE``'s parser; ``block`` names what ``--write`` replaces."""
    p = argparse.ArgumentParser(prog=f"python -m fedper._recipes.{module}", description=description)
    p.add_argument("--out", type=Path, default=out, help="where the runs go (finished ones are reused)")
    if jobs:
        p.add_argument("--jobs", type=int, default=2, help="runs at a time (each one torch thread)")
    p.add_argument("--fedper", default=str(Path(sys.executable).with_name("fedper")), help="the fedper command")
    p.add_argument("--write", type=Path, default=None, help=f"replace the {block} block of this markdown file")
    return p
