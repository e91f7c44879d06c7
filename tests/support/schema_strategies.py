"""Hypothesis strategies for JSON documents from a pydantic model's JSON Schema.

hypothesis-jsonschema would be the tool, but 0.23.1 (its latest) fails against the hypothesis
this project installs (``'many' object has no attribute 'more'``), so this covers the subset
pydantic emits. A keyword it does not know raises instead of being ignored: a constraint left
out would let the tests feed documents the schema forbids, and the schema's own constraints
are what the readers are tested against.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

# Keywords that say nothing about which values are valid.
_ANNOTATIONS = {"title", "description", "default", "examples", "discriminator"}
_KNOWN = _ANNOTATIONS | {
    "$ref", "$defs", "anyOf", "oneOf", "enum", "const", "type", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "items", "prefixItems", "minItems", "maxItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "pattern", "minLength", "maxLength", "minProperties", "maxProperties",
}  # fmt: skip

JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.floats(allow_nan=False,
    allow_infinity=False) | st.text(max_size=8)  # fmt: skip
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)  # fmt: skip


def from_schema(schema: dict[str, Any], max_size: int = 3) -> st.SearchStrategy[Any]:
    """Documents valid under ``schema`` (a model's ``model_json_schema()``), objects and arrays
    without a bound of their own held to ``max_size`` entries so that examples stay small."""
    return _Builder(schema.get("$defs", {}), max_size).build(schema)


class _Builder:
    def __init__(self, defs: dict[str, Any], max_size: int) -> None:
        self.defs, self.max_size = defs, max_size

    def build(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        unknown = set(node) - _KNOWN
        if unknown:
            raise ValueError(f"schema keywords this generator does not know: {sorted(unknown)}")
        if "$ref" in node:
            return st.deferred(lambda: self.build(self.defs[node["$ref"].removeprefix("#/$defs/")]))
        if "anyOf" in node or "oneOf" in node:  # pydantic's oneOf: a discriminated union, exclusive by its tag
            return st.one_of([self.build(option) for option in node.get("anyOf", node.get("oneOf"))])
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        kind = node.get("type")
        if kind is None:
            return ANY_JSON
        if isinstance(kind, list):
            return st.one_of([self.build({**node, "type": k}) for k in kind])
        return getattr(self, f"_{kind}")(node)

    def _null(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        return st.none()

    def _boolean(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        return st.booleans()

    def _integer(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        low = node.get("minimum", node.get("exclusiveMinimum", -(2**40) - 1) + 1)
        high = node.get("maximum", node.get("exclusiveMaximum", 2**40 + 1) - 1)
        return st.integers(math.ceil(low), math.floor(high))

    def _number(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        return st.floats(
            min_value=low, max_value=high, exclude_min="exclusiveMinimum" in node,
            exclude_max="exclusiveMaximum" in node, allow_nan=False, allow_infinity=False,
        ) | (  # JSON writes 1.0 as 1: whole numbers too, where the bounds are inclusive
            st.integers(math.ceil(low), math.floor(high)) if "minimum" in node and "maximum" in node else st.nothing()
        )  # fmt: skip

    def _string(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        low, high = node.get("minLength", 0), node.get("maxLength", 12)
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=low, max_size=high)

    def _array(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        if "prefixItems" in node:
            return st.tuples(*(self.build(item) for item in node["prefixItems"])).map(list)
        low = node.get("minItems", 0)
        return st.lists(
            self.build(node.get("items", {})), min_size=low, max_size=node.get("maxItems", low + self.max_size)
        )

    def _object(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        properties = node.get("properties", {})
        if properties:
            required = set(node.get("required", ()))
            fixed = {k: self.build(v) for k, v in properties.items() if k in required}
            optional = {k: self.build(v) for k, v in properties.items() if k not in required}
            return st.fixed_dictionaries(fixed, optional=optional)
        low = node.get("minProperties", 0)
        high = node.get("maxProperties", low + self.max_size)
        if "patternProperties" in node:
            ((pattern, value),) = node["patternProperties"].items()
            keys = st.from_regex(pattern, fullmatch=True)
        else:
            value = node.get("additionalProperties", {})
            keys = self._string(node.get("propertyNames", {"type": "string"}))
        return st.dictionaries(keys, self.build(value if isinstance(value, dict) else {}), min_size=low, max_size=high)
