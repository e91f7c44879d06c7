"""One import name: the folders at the top of the repository are ``fedper``'s subpackages.

``fedper/server``, ``fedper/device_runtime``, ``fedper/export`` and ``fedper/_recipes`` are links
to ``server/``, ``device_runtime/``, ``export/`` and ``recipes/``. From the repository's root the
folders are also importable under their own names, which would load a second copy of each
module (two ``RoundManager`` classes, two metric registries): no code may do that.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.source_tree import ROOT, copy_tracked, tracked

LINKS = {"server": "server", "device_runtime": "device_runtime", "export": "export", "_recipes": "recipes"}
BARE = set(LINKS.values())


def _bare_imports(source: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{source.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in BARE]
    return found


def test_the_folders_are_linked_into_the_namespace() -> None:
    for name, folder in LINKS.items():
        link = ROOT / "fedper" / name
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", link
        assert link.resolve() == (ROOT / folder).resolve()


def test_no_code_imports_a_folder_by_its_bare_name() -> None:
    found = [hit for source in tracked("*.py") if not source.is_symlink() for hit in _bare_imports(source)]
    assert not found, "import these as fedper.<name> (fedper._recipes for recipes):\n" + "\n".join(found)


def test_the_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    source = copy_tracked(tmp_path / "source")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"fedper"}
    for expected in ("fedper/server/app.py", "fedper/device_runtime/device.py", "fedper/export/pipeline.py",
                     "fedper/_recipes/demo.py", "fedper/_recipes/report_template.html", "fedper/common/protocol.py",
                     "fedper/server/dashboard.html"):  # fmt: skip
        assert expected in names, expected
