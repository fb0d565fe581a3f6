"""A small JSON Schema validator for the subset llmd constrains output to (llmd/structured/jsonschema.py),
written independently of the grammar so tests can check generated values against it."""
from __future__ import annotations

import re
from typing import Any

_FORMATS = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}",
}
_FORMATS["date-time"] = _FORMATS["date"] + "T" + _FORMATS["time"]


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"object": dict, "array": list, "string": str, "boolean": bool,
            "null": type(None)}[kind] is type(value)


def errors(value: Any, schema: Any, root: Any = None, path: str = "$") -> list[str]:
    """Why value does not satisfy schema ([] when it does)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if "$ref" in schema:
        ref = schema["$ref"]
        target = root if ref == "#" else root[ref.split("/")[1]][ref.split("/")[2]]
        return errors(value, target, root, path)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            if any(not errors(value, s, root, path) for s in schema[key]):
                return []
            return [f"{path}: matches no branch of {key}"]
    if "allOf" in schema:
        return [e for s in schema["allOf"] for e in errors(value, s, root, path)]
    if "const" in schema and value != schema["const"]:
        return [f"{path}: {value!r} is not the const"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not in the enum"]
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return [f"{path}: {value!r} is not of type {kinds}"]
    found = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        found += [f"{path}: lacks {name!r}" for name in schema.get("required", []) if name not in value]
        for k, v in value.items():
            if k in props:
                found += errors(v, props[k], root, f"{path}.{k}")
            elif extra is False:
                found.append(f"{path}: has the extra key {k!r}")
            elif isinstance(extra, dict):
                found += errors(v, extra, root, f"{path}.{k}")
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            found.append(f"{path}: {len(value)} items")
        for i, v in enumerate(value):
            found += errors(v, schema.get("items", True), root, f"{path}[{i}]")
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            found.append(f"{path}: length {len(value)}")
        if "format" in schema and not re.fullmatch(_FORMATS[schema["format"]], value):
            found.append(f"{path}: {value!r} is not a {schema['format']}")
    elif _is(value, "number"):
        checks = {"minimum": value >= schema.get("minimum", value),
                  "maximum": value <= schema.get("maximum", value),
                  "exclusiveMinimum": "exclusiveMinimum" not in schema or value > schema["exclusiveMinimum"],
                  "exclusiveMaximum": "exclusiveMaximum" not in schema or value < schema["exclusiveMaximum"]}
        found += [f"{path}: {value!r} breaks {k}" for k, ok in checks.items() if not ok]
    return found
