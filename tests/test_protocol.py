"""The protocol in one place: the schema, the Java constants and the spec follow the code."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

from fedper import protocol

ROOT = Path(__file__).resolve().parent.parent
JAVA = ROOT / "android_demo" / "core" / "src" / "main" / "java" / "org" / "fedper" / "core"


def test_the_schema_file_is_generated_from_the_code() -> None:
    assert protocol.SCHEMA_FILE.read_text() == protocol.schema_text(), (
        "docs/protocol.schema.json is stale: run python -m fedper.protocol"
    )


def test_the_java_constants_are_generated_from_the_schema() -> None:
    generator = runpy.run_path(str(ROOT / "android_demo" / "core" / "generate_protocol.py"))
    expected = generator["render"](json.loads(protocol.SCHEMA_FILE.read_text()))
    assert (JAVA / "Protocol.java").read_text() == expected, (
        "Protocol.java is stale: run python android_demo/core/generate_protocol.py"
    )


def test_the_java_core_spells_no_protocol_name_of_its_own() -> None:
    fedper = protocol.schema()["x-fedper"]
    names = set(fedper["error_codes"]) | {
        v for group in ("paths", "metadata", "headers", "env") for v in fedper[group].values() if isinstance(v, str)
    }
    for source in JAVA.glob("*.java"):
        if source.name == "Protocol.java":
            continue
        literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', source.read_text()))
        assert not literals & names, f"{source.name} spells {sorted(literals & names)}: use Protocol.*"
        assert not [s for s in literals if s.startswith(protocol.PREFIX + "/")], f"{source.name} spells a path"


def test_the_java_task_reads_only_fields_of_the_task_body() -> None:
    fields = set(re.findall(r'm\.[a-zA-Z]+\("([a-z0-9_]+)"', (JAVA / "Task.java").read_text()))
    assert fields and fields <= set(protocol.Task.model_fields), fields - set(protocol.Task.model_fields)


def test_the_spec_names_every_error_code_and_metadata_key() -> None:
    spec = (ROOT / "docs" / "PROTOCOL.md").read_text()
    table = spec[spec.index("| 400 | `bad_request`") : spec.index("A rejected request changes")]
    listed = set(re.findall(r"`([a-z_]+)`", table))
    assert listed == {c.value for c in protocol.ErrorCode}
    for key in (protocol.Metadata.NUM_SAMPLES, protocol.Metadata.BASE_VERSION, protocol.Metadata.METRIC_PREFIX):
        assert f"`{key}" in spec
    assert f"revision {protocol.REVISION}" in spec


def test_every_server_error_code_is_in_the_enum() -> None:
    """No error code is spelled outside fedper/protocol.py on the server side."""
    known = {c.value for c in protocol.ErrorCode}
    for source in (ROOT / "server").glob("*.py"):
        text = source.read_text()
        for code in re.findall(r"ProtocolError\(\s*\d+,\s*\"([a-z_]+)\"", text):
            assert code in known, (source.name, code)
        assert not re.search(r"(bad_request|unprocessable|conflict)\(\s*\"", text), source.name
