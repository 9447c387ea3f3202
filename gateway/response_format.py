"""``response_format`` (OpenAI's shape, on every route) -> the job's ``ResponseFormat``, or a 400.

``{"type": "text"}`` or none: free text. ``{"type": "json_object"}``: any JSON object.
``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``: JSON that
validates against ``schema``. The inference worker decodes under a grammar of the schema
(``services/engine/grammar.py``), so an answer always parses and validates; what the grammar
cannot hold an answer to is refused here, before anything is stored: a schema that is not valid
JSON Schema (draft 2020-12 meta-schema), a keyword outside ``SUPPORTED`` (``allOf``, ``not``,
``uniqueItems``... each measured to let invalid output through), a remote ``$ref``, a pattern with
lookaround, backreferences or inline flags, or a schema too large or too deep.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from jsonschema import Draft202012Validator, SchemaError

from gateway.errors import APIError
from shared.schemas import ResponseFormat

MAX_SCHEMA_CHARS = 32_000
MAX_DEPTH = 32
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly"}
)
SUPPORTED = ANNOTATIONS | {
    "type", "enum", "const", "anyOf", "$ref", "$defs", "definitions", "format",
    "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
}  # fmt: skip
SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name -> subschema
SCHEMA_LISTS = ("anyOf", "prefixItems")  # [subschema]
SCHEMA_VALUES = ("items", "additionalProperties")  # subschema (or a boolean)
UNSAFE_PATTERN = re.compile(r"\(\?[^:]|\\[1-9pPk]")  # lookaround, named groups, flags, backrefs, \p


def parse_response_format(value: Any, stop: list[str], min_tokens: int = 0) -> ResponseFormat | None:
    """A request's ``response_format`` (a dict, or its JSON text from a form field). Not with stop
    strings (one could cut the JSON short) nor ``min_tokens`` (it could forbid the EOS that ends it)."""
    raw = _as_object(value)
    if raw is None:
        return None
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind not in ("json_object", "json_schema"):
        _refuse("type must be one of 'text', 'json_object', 'json_schema'", "response_format.type")
    if stop:
        _refuse("stop strings cannot be combined with a JSON response format", "stop")
    if min_tokens:
        _refuse("min_tokens cannot be combined with a JSON response format", "min_tokens")
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    spec = raw.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(schema, dict):
        return _refuse("json_schema.schema: a JSON Schema object is required", "response_format.json_schema")
    name = spec.get("name")
    return ResponseFormat(
        type="json_schema", json_schema=checked_schema(schema), name=str(name) if name else None
    )


def checked_schema(schema: dict[str, Any]) -> str:
    """The schema as canonical JSON text, once it is valid and within what the grammar enforces."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        _refuse(f"json_schema.schema: larger than {MAX_SCHEMA_CHARS} characters", "response_format")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path)
        _refuse(
            f"json_schema.schema is not a valid JSON Schema at '{where}': {exc.message}", "response_format"
        )
    _walk(schema, "#", 0)
    return text


def _walk(schema: Any, where: str, depth: int) -> None:
    """Every subschema: only SUPPORTED keywords, local references, safe patterns, bounded depth."""
    if isinstance(schema, bool):
        return
    if depth > MAX_DEPTH:
        _refuse(f"json_schema.schema nests deeper than {MAX_DEPTH} levels", "response_format")
    for key in schema:
        if key not in SUPPORTED:
            _refuse(f"json_schema.schema: keyword '{key}' at '{where}' is not supported", "response_format")
    if isinstance(schema.get("$ref"), str) and not schema["$ref"].startswith("#"):
        _refuse(
            f"json_schema.schema: only local $ref ('#/...') is supported, at '{where}'", "response_format"
        )
    if isinstance(schema.get("pattern"), str) and UNSAFE_PATTERN.search(schema["pattern"]):
        _refuse(
            f"json_schema.schema: pattern at '{where}' uses lookaround, backreferences, named groups, "
            "inline flags or \\p classes, which are not supported",
            "response_format",
        )
    for key, sub, path in _children(schema):
        _walk(sub, f"{where}/{key}{path}", depth + 1)


def _children(schema: dict[str, Any]) -> list[tuple[str, Any, str]]:
    found: list[tuple[str, Any, str]] = [(k, schema[k], "") for k in SCHEMA_VALUES if k in schema]
    for key in SCHEMA_MAPS:
        found += [(key, sub, f"/{name}") for name, sub in schema.get(key, {}).items()]
    for key in SCHEMA_LISTS:
        found += [(key, sub, f"/{i}") for i, sub in enumerate(schema.get(key, []))]
    return found


def _as_object(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            _refuse("not valid JSON", "response_format")
    if not isinstance(value, dict):
        _refuse('expected an object such as {"type": "json_object"}', "response_format")
    return value


def _refuse(message: str, param: str) -> NoReturn:
    raise APIError(400, f"response_format: {message}", param=param, code="invalid_response_format")
