"""``response_format`` (OpenAI's shape, on every route) -> the job's ``ResponseFormat``, or a 400.

``{"type": "text"}`` or none: free text. ``{"type": "json_object"}``: any JSON object.
``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``: JSON that
validates against ``schema``. The inference worker decodes under a grammar of the schema
(``services/engine/grammar.py``), so an answer always parses and validates; what the grammar
cannot hold an answer to, or would not compile, is refused here, before anything is stored: a
schema that is not valid JSON Schema (draft 2020-12 meta-schema), a keyword outside ``SUPPORTED``
(``allOf``, ``not``, ``uniqueItems``... each measured to let invalid output through), a keyword
the grammar ignores where it stands (beside ``$ref``, ``anyOf``, ``enum`` or ``const``, a length
beside a ``pattern`` or ``format``, a bound in a schema without ``type``, a ``required`` name that
``properties`` does not declare...), a ``$ref`` that is remote or points at no subschema, bounds
that no value meets, a pattern with lookaround, backreferences or inline flags, or a schema too
large or too deep. The gateway does not import xgrammar (it pulls torch): each rule here was
measured against it (README "Structured output").
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any, NoReturn
from urllib.parse import unquote

from jsonschema import Draft202012Validator, SchemaError

from gateway.errors import APIError
from shared.schemas import ResponseFormat

MAX_SCHEMA_CHARS = 32_000
MAX_DEPTH = 32
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 4  # a schema level can take two JSON ones: properties -> name -> schema
TOO_DEEP = f"json_schema.schema nests deeper than {MAX_DEPTH} levels"
INT64 = (-(2**63), 2**63 - 1)  # the grammar's integers
LOOSE_MAX_LENGTH = 2048  # pydantic's HttpUrl: 2083; beside a format, not enforced by the grammar
DECIMALS = 6  # the most a number between two bounds gets from the grammar
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly"}
)
CONTAINERS = frozenset({"$defs", "definitions"})
SUPPORTED = ANNOTATIONS | CONTAINERS | {
    "type", "enum", "const", "anyOf", "$ref", "format",
    "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
}  # fmt: skip
SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name -> subschema
SCHEMA_LISTS = ("anyOf", "prefixItems")  # [subschema]
SCHEMA_VALUES = ("items", "additionalProperties")  # subschema (or a boolean)
# Where one of these stands, the grammar follows it alone: any other constraint beside it is not held.
ALONE = {
    "$ref": ANNOTATIONS | CONTAINERS,
    "anyOf": ANNOTATIONS | CONTAINERS,
    "enum": ANNOTATIONS | CONTAINERS | {"type"},
    "const": ANNOTATIONS | CONTAINERS | {"type"},
}
# The grammar reads these only in a schema that names its "type".
TYPED = (
    "format", "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties", "maxProperties",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
)  # fmt: skip
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
MIN_MAX = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
UNSAFE_PATTERN = re.compile(r"\(\?[^:]|\\[1-9pPk]")  # lookaround, named groups, flags, backrefs, \p
TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER


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
    _check_json(schema)  # first: what follows recurses, and would overflow the stack on a deep one
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        _refuse(f"json_schema.schema: larger than {MAX_SCHEMA_CHARS} characters", "response_format")
    _check_meta(schema)
    found: dict[str, Any] = {}
    _collect(schema, "#", 0, found)
    for where, sub in found.items():
        if isinstance(sub, dict):
            _check_subschema(sub, where, found)
    return text


def _check_json(value: Any) -> None:
    """Bounded nesting and finite numbers, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            _refuse(TOO_DEEP, "response_format")
        if isinstance(node, float) and not math.isfinite(node):
            _refuse("json_schema.schema holds NaN or Infinity, which JSON does not allow", "response_format")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)


def _check_meta(schema: dict[str, Any]) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path)
        _refuse(
            f"json_schema.schema is not a valid JSON Schema at '{where}': {exc.message}", "response_format"
        )
    except RecursionError:  # the depth is bounded already: Python's re, compiling a pattern's groups
        _refuse("json_schema.schema: a pattern nests its groups too deeply", "response_format")


def _collect(schema: Any, where: str, depth: int, found: dict[str, Any]) -> None:
    """Every subschema by its JSON pointer ('#/properties/a~1b'), as a local $ref names it."""
    if depth > MAX_DEPTH:
        _refuse(TOO_DEEP, "response_format")
    found[where] = schema
    if isinstance(schema, dict):
        for path, sub in _children(schema):
            if sub is False and path not in SCHEMA_VALUES:
                _refuse(
                    f"json_schema.schema: false at '{where}/{path}' is not supported (only as items "
                    "or additionalProperties)",
                    "response_format",
                )
            _collect(sub, f"{where}/{path}", depth + 1, found)


def _children(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = [(k, schema[k]) for k in SCHEMA_VALUES if k in schema]
    for key in SCHEMA_MAPS:
        found += [(f"{key}/{_escape(name)}", sub) for name, sub in schema.get(key, {}).items()]
    for key in SCHEMA_LISTS:
        found += [(f"{key}/{i}", sub) for i, sub in enumerate(schema.get(key, []))]
    return found


def _check_subschema(schema: dict[str, Any], where: str, found: dict[str, Any]) -> None:
    _check_keywords(schema, where)
    _check_alone(schema, where)
    _check_ref(schema, where, found)
    _check_typed(schema, where)
    _check_values(schema, where)
    _check_strings(schema, where)
    _check_counts(schema, where)
    _check_objects(schema, where)
    _check_arrays(schema, where)
    _check_integers(schema, where)
    _check_range(schema, where)


def _check_keywords(schema: dict[str, Any], where: str) -> None:
    """Only SUPPORTED keywords, ``$id`` at the root alone, safe patterns."""
    for key in schema:
        if key not in SUPPORTED:
            _refuse(f"json_schema.schema: keyword '{key}' at '{where}' is not supported", "response_format")
    if "$id" in schema and where != "#":  # it would move the base of the $refs under it; the grammar's stays
        _refuse(
            f"json_schema.schema: '$id' is only supported at the root, not at '{where}'", "response_format"
        )
    if isinstance(schema.get("pattern"), str) and UNSAFE_PATTERN.search(schema["pattern"]):
        _refuse(
            f"json_schema.schema: pattern at '{where}' uses lookaround, backreferences, named groups, "
            "inline flags or \\p classes, which are not supported",
            "response_format",
        )


def _check_alone(schema: dict[str, Any], where: str) -> None:
    for key, beside in ALONE.items():
        extra = sorted(set(schema) - beside - {key}) if key in schema else []
        if extra:
            _refuse(
                f"json_schema.schema: '{extra[0]}' beside '{key}' at '{where}' is not supported: the "
                f"grammar follows only the '{key}' there",
                "response_format",
            )


def _check_ref(schema: dict[str, Any], where: str, found: dict[str, Any]) -> None:
    """A ``$ref`` is a JSON pointer to a subschema of this schema."""
    if "$ref" not in schema:
        return
    ref = schema["$ref"]
    target = _pointer(ref)
    if target is None:
        _refuse(
            f"json_schema.schema: only local $ref ('#' or '#/...') is supported, at '{where}'",
            "response_format",
        )
    if target not in found or found[target] is False:
        _refuse(f"json_schema.schema: $ref '{ref}' at '{where}' points to no subschema", "response_format")
    _check_chain(target, where, found)


def _check_chain(target: str, where: str, found: dict[str, Any]) -> None:
    """A chain of $refs ends at a schema (the grammar refuses a loop of bare references)."""
    seen = {where}
    while isinstance(found[target], dict) and "$ref" in found[target]:
        if target in seen:
            _refuse(f"json_schema.schema: $ref at '{where}' loops without a schema", "response_format")
        seen.add(target)
        following = _pointer(found[target]["$ref"])
        if following not in found:  # a bad one: refused where it stands
            return
        target = following


def _pointer(ref: str) -> str | None:
    """A local $ref named as ``_collect`` names subschemas; None for a remote one or an anchor."""
    if not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return None
    tokens = [token.replace("~1", "/").replace("~0", "~") for token in fragment.split("/")[1:]]
    return "#" + "".join(f"/{_escape(token)}" for token in tokens)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _check_typed(schema: dict[str, Any], where: str) -> None:
    key = next((k for k in TYPED if k in schema), None)
    if key is not None and "type" not in schema:
        _refuse(
            f"json_schema.schema: '{key}' at '{where}' needs a \"type\" beside it: the grammar ignores "
            "it in a schema without one",
            "response_format",
        )


def _check_values(schema: dict[str, Any], where: str) -> None:
    """The grammar writes an ``enum``'s values as they are: each must be of the schema's type."""
    values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if values == []:
        _refuse(f"json_schema.schema: the enum at '{where}' is empty: no value is allowed", "response_format")
    types = _types(schema)
    for value in values or ():
        if types and not any(TYPE_CHECKER.is_type(value, t) for t in types):
            _refuse(
                f"json_schema.schema: the value {json.dumps(value)[:40]} at '{where}' is not of its "
                f"type {'/'.join(types)}",
                "response_format",
            )


def _check_strings(schema: dict[str, Any], where: str) -> None:
    """The grammar holds a string to one of: a pattern, a format, lengths. Beside a format, lengths
    that cannot bind are let through (pydantic's URL types carry both): a ``minLength`` of at most 1
    (no format matches the empty string) and a ``maxLength`` of ``LOOSE_MAX_LENGTH`` or more, which
    the grammar does not enforce (README "Structured output")."""
    if schema.get("type") is not None and "string" not in _types(schema):
        return
    loose = "format" in schema and "pattern" not in schema
    used = [k for k in ("pattern", "format", "minLength", "maxLength") if k in schema]
    if loose:
        used = [k for k in used if not _loose_length(k, schema[k])]
    if used and used[0] in ("pattern", "format") and len(used) > 1:
        _refuse(
            f"json_schema.schema: '{used[0]}' and '{used[1]}' at '{where}' cannot be combined: the "
            f"grammar enforces only the {used[0]}",
            "response_format",
        )


def _loose_length(keyword: str, value: Any) -> bool:
    if keyword == "minLength":
        return _whole(value) and value <= 1
    return keyword == "maxLength" and _whole(value) and value >= LOOSE_MAX_LENGTH


def _check_counts(schema: dict[str, Any], where: str) -> None:
    for low, high in MIN_MAX:
        if low in schema and high in schema and schema[low] > schema[high]:
            _refuse(
                f"json_schema.schema: {low} {schema[low]} is above {high} {schema[high]} at '{where}'",
                "response_format",
            )


def _check_objects(schema: dict[str, Any], where: str) -> None:
    """Required names declared (the grammar enforces no other); property counts it can hold."""
    declared, required = schema.get("properties", {}), set(schema.get("required", []))
    for name in sorted(required - set(declared)):
        _refuse(
            f"json_schema.schema: required '{name}' at '{where}' is not declared under properties there, "
            "and the grammar cannot enforce it: declare it under properties",
            "response_format",
        )
    if "object" not in _types(schema):
        return
    if "maxProperties" in schema and schema["maxProperties"] < len(required):
        _refuse(f"json_schema.schema: maxProperties at '{where}' is below its required", "response_format")
    least, others = schema.get("minProperties", 0), schema.get("additionalProperties", False)
    if others is False and least > len(declared):  # the grammar allows no undeclared name by default
        _refuse(
            f"json_schema.schema: minProperties at '{where}' asks for more than the {len(declared)} "
            "properties declared, and without additionalProperties the grammar allows no others",
            "response_format",
        )
    if others is not False and least > len(required):  # the grammar may repeat an undeclared name
        _refuse(
            f"json_schema.schema: minProperties at '{where}' cannot be enforced beyond the required "
            "names beside additionalProperties",
            "response_format",
        )


def _check_arrays(schema: dict[str, Any], where: str) -> None:
    """Item counts the grammar can hold (it allows no items past prefixItems unless ``items``)."""
    if "array" not in _types(schema):
        return
    fixed = len(schema.get("prefixItems", []))
    if schema.get("maxItems", fixed) < fixed:
        _refuse(f"json_schema.schema: maxItems at '{where}' is below its prefixItems", "response_format")
    if schema.get("items", False) is False and schema.get("minItems", 0) > fixed:
        _refuse(
            f"json_schema.schema: minItems at '{where}' asks for more than its {fixed} prefixItems, and "
            "without items the grammar allows no others",
            "response_format",
        )


def _check_integers(schema: dict[str, Any], where: str) -> None:
    """An integer's bounds are whole 64-bit numbers; ``multipleOf`` holds only a whole one on integers."""
    types = _types(schema)
    for key in [k for k in NUMBER_BOUNDS if k in schema] if "integer" in types else []:
        if not (_whole(schema[key]) and INT64[0] <= schema[key] <= INT64[1]):
            _refuse(
                f"json_schema.schema: {key} at '{where}' must be a whole 64-bit number for an integer",
                "response_format",
            )
    if "multipleOf" in schema and ("number" in types or not _whole(schema["multipleOf"])):
        _refuse(
            f"json_schema.schema: multipleOf at '{where}' is only enforced as a whole number on "
            '"type": "integer"',
            "response_format",
        )


def _check_range(schema: dict[str, Any], where: str) -> None:
    """Some value within the bounds that the grammar can write: an integer, or a number of at most
    ``DECIMALS`` decimals (finer ranges compile to a grammar that ends before any digit)."""
    types = _types(schema)
    low = _edge(schema, "minimum", "exclusiveMinimum", lower=True)
    high = _edge(schema, "maximum", "exclusiveMaximum", lower=False)
    if low is None or high is None or not {"integer", "number"} & set(types):
        return
    scale, what = (
        (1, "integer") if "integer" in types else (10**DECIMALS, f"number with at most {DECIMALS} decimals")
    )
    if _on_grid(*low, scale, up=True) > _on_grid(*high, scale, up=False):
        _refuse(f"json_schema.schema: no {what} is within the bounds at '{where}'", "response_format")


def _on_grid(bound: float, open_: bool, scale: int, up: bool) -> int:
    """The first (``up``) or last multiple of ``1 / scale`` within a bound, in those units. Exact:
    from the bound as its JSON text writes it."""
    units = Fraction(repr(bound)) * scale
    whole = math.ceil(units) if up else math.floor(units)
    if open_ and whole == units:
        return whole + 1 if up else whole - 1
    return whole


def _edge(schema: dict[str, Any], closed: str, open_: str, lower: bool) -> tuple[float, bool] | None:
    """The tighter of a closed and an open bound: (value, open)."""
    bounds = [(schema[k], k == open_) for k in (closed, open_) if k in schema]
    if not bounds:
        return None
    if lower:
        return max(bounds)
    return min(bounds, key=lambda bound: (bound[0], not bound[1]))


def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def _whole(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _as_object(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            _refuse("not valid JSON", "response_format")
        except RecursionError:
            _refuse(TOO_DEEP, "response_format")
    if not isinstance(value, dict):
        _refuse('expected an object such as {"type": "json_object"}', "response_format")
    return value


def _refuse(message: str, param: str) -> NoReturn:
    raise APIError(400, f"response_format: {message}", param=param, code="invalid_response_format")
