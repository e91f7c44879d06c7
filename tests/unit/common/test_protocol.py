"""The protocol in one place: the schema, the Java constants and the spec follow the code."""

from __future__ import annotations

import ast
import base64
import json
import re
import runpy
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedper.common import manifest, protocol

ROOT = Path(__file__).resolve().parents[3]
JAVA = ROOT / "android_demo" / "core" / "src" / "main" / "java" / "org" / "fedper" / "core"


def test_the_schema_file_is_generated_from_the_code() -> None:
    assert protocol.SCHEMA_FILE.read_text() == protocol.schema_text(), (
        "docs/protocol.schema.json is stale: run python -m fedper.common.protocol"
    )


def test_the_java_constants_are_generated_from_the_schema() -> None:
    generator = runpy.run_path(str(ROOT / "android_demo" / "core" / "generate_protocol.py"))
    expected = generator["render"](json.loads(protocol.SCHEMA_FILE.read_text()))
    assert (JAVA / "Protocol.java").read_text() == expected, (
        "Protocol.java is stale: run python android_demo/core/generate_protocol.py"
    )


def test_the_manifest_schema_and_its_java_names_are_generated_from_the_code() -> None:
    assert manifest.SCHEMA_FILE.read_text() == manifest.schema_text(), (
        "docs/manifest.schema.json is stale: run python -m fedper.common.manifest"
    )
    generator = runpy.run_path(str(ROOT / "android_demo" / "core" / "generate_protocol.py"))
    expected = generator["render_manifest"](json.loads(manifest.SCHEMA_FILE.read_text()))
    assert (JAVA / "ManifestKeys.java").read_text() == expected, (
        "ManifestKeys.java is stale: run python android_demo/core/generate_protocol.py"
    )


def test_the_java_manifest_reads_fields_through_generated_names() -> None:
    """Manifest.java names no manifest field with a literal (ManifestKeys.*), nor a task config key
    (Protocol.Body.TaskConfig.*)."""
    schema = manifest.schema()
    fields = set(schema["properties"]) | {f for model in schema["$defs"].values() for f in model["properties"]}
    fields |= set(protocol.TaskConfig.model_fields)
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', (JAVA / "Manifest.java").read_text()))
    assert not literals & fields, f"Manifest.java spells {sorted(literals & fields)}: use ManifestKeys.*"


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


def test_the_java_client_reads_and_writes_bodies_through_generated_names() -> None:
    """ProtocolClient.java builds the enrollment and reads the enrollment's, the upload's and the
    errors' answers: their field names come from Protocol.Body, not from literals."""
    models = {m.__name__: m for m in protocol.MODELS}
    fields = {f for m in ("EnrollmentRequest", "Enrolled", "Accepted", "Error") for f in models[m].model_fields}
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', (JAVA / "ProtocolClient.java").read_text()))
    assert not literals & fields, f"ProtocolClient.java spells {sorted(literals & fields)}: use Protocol.Body.*"


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
    """No error code is spelled outside fedper/common/protocol.py on the server side."""
    known = {c.value for c in protocol.ErrorCode}
    for source in (ROOT / "server").glob("*.py"):
        text = source.read_text()
        for code in re.findall(r"ProtocolError\(\s*\d+,\s*\"([a-z_]+)\"", text):
            assert code in known, (source.name, code)
        assert not re.search(r"(MalformedError|UnacceptableError|CodedRefusalError)\(\s*\"", text), source.name


# The same names spelled for another purpose: a results column, the updates table's columns, a
# class attribute. Each is checked to be what it says, so a new protocol literal cannot hide here.
NOT_PROTOCOL = {
    ("fedper/results.py", "num_samples"): "metrics.csv's column",
    ("server/storage/rounds.py", "num_samples"): "the updates table's column",
    ("server/storage/rounds.py", "base_version"): "the updates table's column",
    ("server/http_protocol.py", "header_timeout"): "the HTTP layer's attribute (the code is ErrorCode's)",
}


def _string_literals(source: Path) -> list[tuple[int, str]]:
    """String constants of a module, f-strings' literal parts included, docstrings excluded."""
    tree = ast.parse(source.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_python_code_spells_no_protocol_name_outside_the_protocol_module() -> None:
    fedper = protocol.schema()["x-fedper"]
    names = set(fedper["error_codes"]) | {
        v for group in ("paths", "metadata", "headers", "env") for v in fedper[group].values() if isinstance(v, str)
    }
    found = []
    for package in ("fedper", "server", "device_runtime", "export", "recipes"):
        for source in sorted((ROOT / package).rglob("*.py")):
            relative = source.relative_to(ROOT).as_posix()
            if relative == "fedper/common/protocol.py":
                continue
            for line, value in _string_literals(source):
                if (value in names or value.startswith(protocol.PREFIX + "/")) and (
                    relative,
                    value,
                ) not in NOT_PROTOCOL:
                    found.append(f"{relative}:{line}: {value!r}")
    assert not found, (
        "protocol names spelled outside fedper/common/protocol.py (use Route, Header, ErrorCode...):\n"
        + "\n".join(found)
    )


def test_the_allowed_spellings_are_still_there() -> None:
    for (relative, value), _why in NOT_PROTOCOL.items():
        assert value in {v for _line, v in _string_literals(ROOT / relative)}, f"{relative} no longer spells {value!r}"


def test_every_refusal_has_its_answer() -> None:
    """Every domain refusal answers a 4xx or 503 with a protocol code (by its own row of
    server.errors.REFUSALS or its nearest base's); none would answer 500."""
    from fedper.server import refusals as r
    from fedper.server.errors import REFUSALS, answer

    def every(kind: type[r.RefusalError]) -> list[type[r.RefusalError]]:
        return [k for sub in kind.__subclasses__() for k in (sub, *every(sub))]

    built = {
        r.RunFinishedError: r.RunFinishedError(),
        r.NotFoundError: r.NotFoundError("round 9"),
        r.BodyTooLargeError: r.BodyTooLargeError(10),
        r.MalformedError: r.MalformedError(protocol.ErrorCode.MALFORMED_JSON, "why"),
        r.UnacceptableError: r.UnacceptableError(protocol.ErrorCode.BAD_METADATA, "why"),
    }
    kinds = [k for k in every(r.RefusalError) if k is not r.CodedRefusalError]
    assert set(REFUSALS) <= set(kinds) and len(kinds) >= len(REFUSALS)
    for kind in kinds:
        refusal = built.get(kind) or kind("why", 7)
        error = answer(refusal)
        assert 400 <= error.status < 500 or error.status == 503, kind
        assert error.code in {c.value for c in protocol.ErrorCode}, kind
        assert error.headers == ({} if kind in built else {protocol.Header.RETRY_AFTER: "7"})


@given(st.binary(max_size=200))
def test_bytes_in_json_round_trip_as_standard_base64(data: bytes) -> None:
    text = protocol.octets_text(data)
    assert text == base64.b64encode(data).decode()
    assert protocol.octets(text) == data


@given(st.one_of(st.text(max_size=60), st.integers(), st.none()))
def test_anything_but_strict_base64_is_refused_as_octets(value: object) -> None:
    try:
        strict = isinstance(value, str) and base64.b64encode(base64.b64decode(value, validate=True)).decode() == value
    except ValueError:
        strict = False
    if strict:
        assert protocol.octets(value) == base64.b64decode(value)  # type: ignore[arg-type]
    else:
        with pytest.raises(protocol.OctetsError):
            protocol.octets(value)  # type: ignore[arg-type]
