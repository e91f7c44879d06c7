"""Write the Java core's ``Protocol.java`` from ``docs/protocol.schema.json``, so the Android
app names the protocol's paths, codes, metadata keys, headers and JSON bodies' fields exactly as
the server does; and ``ManifestKeys.java`` from ``docs/manifest.schema.json``, the manifest's
field names as the exporter writes them.

Usage: python android_demo/core/generate_protocol.py   (tests/unit/common/test_protocol.py fails when stale)
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "protocol.schema.json"
MANIFEST_SCHEMA = ROOT / "docs" / "manifest.schema.json"
JAVA = Path(__file__).resolve().parent / "src/main/java/org/fedper/core"
TARGET = JAVA / "Protocol.java"
MANIFEST_TARGET = JAVA / "ManifestKeys.java"


def _literal(value: object) -> tuple[str, str]:
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    if isinstance(value, float):
        return "double", repr(value)
    return "String", json.dumps(value)


def render(schema: dict) -> str:
    fedper = schema["x-fedper"]
    lines = [
        "package org.fedper.core;",
        "",
        f"/** The device protocol v{fedper['version']} (revision {fedper['revision']}): generated from",
        " * docs/protocol.schema.json by android_demo/core/generate_protocol.py; do not edit. */",
        "public final class Protocol {",
        "  private Protocol() {}",
    ]
    groups = [("Path", fedper["paths"]), ("Metadata", fedper["metadata"]), ("Header", fedper["headers"]),
              ("Env", fedper["env"]), ("ErrorCode", {c.upper(): c for c in fedper["error_codes"]})]  # fmt: skip
    for name, constants in groups:
        lines += ["", f"  public static final class {name} {{", f"    private {name}() {{}}", ""]
        for key in sorted(constants):
            java_type, literal = _literal(constants[key])
            lines.append(f"    public static final {java_type} {key} = {literal};")
        lines.append("  }")
    # Each JSON body's field names, so the client reads them by name: Protocol.Body.Enrolled.TOKEN.
    lines += ["", "  public static final class Body {", "    private Body() {}"]
    lines += _field_classes(schema["$defs"], indent="    ")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _field_classes(models: dict, indent: str, details: bool = False) -> list[str]:
    """One class per object model, one constant per field name: Body.Enrolled.TOKEN = "token";
    with ``details``, a field whose values are a fixed set also gets them (TRAINABLE_CHOICES), and
    an optional field its default (MIN_BATCH_DEFAULT), so a reader fills in what the writer may omit."""
    lines: list[str] = []
    for model in sorted(models):
        lines += ["", f"{indent}public static final class {model} {{", f"{indent}  private {model}() {{}}", ""]
        for field, spec in sorted(models[model]["properties"].items()):
            lines.append(f"{indent}  public static final String {field.upper()} = {json.dumps(field)};")
            if details and "enum" in spec:
                values = ", ".join(json.dumps(v) for v in spec["enum"])
                lines.append(f"{indent}  public static final String[] {field.upper()}_CHOICES = {{{values}}};")
            if details and isinstance(spec.get("default"), str | int | float) and "const" not in spec:
                java_type, literal = _literal(spec["default"])
                lines.append(f"{indent}  public static final {java_type} {field.upper()}_DEFAULT = {literal};")
        lines.append(f"{indent}}}")
    return lines


def render_manifest(schema: dict) -> str:
    """ManifestKeys.java: the manifest's format and its field names, the top level as ``Manifest``."""
    models = {**schema["$defs"], "Manifest": {"properties": schema["properties"]}}
    lines = [
        "package org.fedper.core;",
        "",
        f"/** {schema['title']}: its field names, generated from docs/manifest.schema.json by",
        " * android_demo/core/generate_protocol.py; do not edit. */",
        "public final class ManifestKeys {",
        "  private ManifestKeys() {}",
        "",
        f"  public static final String FORMAT = {json.dumps(schema['properties']['format']['const'])};",
        *_field_classes(models, indent="  ", details=True),
        "}",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render(json.loads(SCHEMA.read_text())))
    MANIFEST_TARGET.write_text(render_manifest(json.loads(MANIFEST_SCHEMA.read_text())))
    print(f"wrote {TARGET} and {MANIFEST_TARGET}")
