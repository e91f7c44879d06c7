"""Write the Java core's ``Protocol.java`` from ``docs/protocol.schema.json``, so the Android
app names the protocol's paths, codes, metadata keys, headers and JSON bodies' fields exactly as
the server does.

Usage: python android_demo/core/generate_protocol.py   (tests/test_protocol.py fails when stale)
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "protocol.schema.json"
TARGET = Path(__file__).resolve().parent / "src/main/java/org/fedper/core/Protocol.java"


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
    for model in sorted(schema["$defs"]):
        lines += ["", f"    public static final class {model} {{", f"      private {model}() {{}}", ""]
        for field in sorted(schema["$defs"][model]["properties"]):
            lines.append(f"      public static final String {field.upper()} = {json.dumps(field)};")
        lines.append("    }")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render(json.loads(SCHEMA.read_text())))
    print(f"wrote {TARGET}")
