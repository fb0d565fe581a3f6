"""JSON as grammar expressions (llmd.structured.grammar): any JSON value, and the values a JSON
Schema admits, for constrained decoding.

Layout. After `{`, `[`, `,` and `:` and before `}` and `]` the JSON may have one
space, or one newline and up to 16 spaces of indentation, and nothing else: a small
model left free to lay out JSON may emit whitespace forever, and one that may not
indent at all tends to close the object at once. Numbers have at most 16 integer
and 16 fraction digits and a 3-digit exponent. Strings are not bounded here: the
engine's token budget closes them in time (native/src/decode/grammar.h). Strings are
valid UTF-8 and escape what JSON requires.

The JSON Schema subset (what tools and response formats use in practice):
  type (one or a list), enum, const, anyOf, oneOf (read as anyOf: overlapping
  branches are not excluded), allOf of one schema, $ref to "#", "#/$defs/NAME" or
  "#/definitions/NAME" (recursion allowed);
  object: properties (written in declared order), required, additionalProperties
    (extra keys are written only by an object without properties: a schema for
    their values, true or absent for any value, false for none);
  string: minLength, maxLength, format date, time, date-time, uuid;
  integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum;
  number: the same bounds when they are whole numbers;
  array: items, minItems, maxItems; boolean; null.
Annotations (title, description, default, examples, ...) are ignored; any other
keyword raises SchemaError naming it.

Other spellings of the same values, for tool calls in a family's own layout:
GemmaSchemaCompiler writes Gemma 4's call syntax, XmlParameterCompiler Qwen3-Coder's
<parameter=P> elements (raw text for string parameters, JSON otherwise) and
GlmParameterCompiler GLM-4.5's <arg_key>/<arg_value> pairs alike, MarkedJsonCompiler
JSON for a parser that ends a call at a marker. None lets a string spell a marker that
would end it early in that family's parser.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from llmd.structured.grammar import (
    EMPTY, Expr, Ref, alt, byte_range, lit, one_of, opt, repeat, seq, star, text_without,
)

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "$schema", "$id", "$defs", "definitions"})
_KEYWORDS = ANNOTATIONS | frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
    "additionalProperties", "minLength", "maxLength", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "items", "minItems", "maxItems"})
_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "string": {"minLength", "maxLength", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "array": {"items", "minItems", "maxItems"},
    "boolean": set(),
    "null": set(),
}
MAX_DIGITS = 16  # integer and fraction digits of a number


class SchemaError(ValueError):
    """A schema llmd cannot constrain output to: `unsupported` for a keyword or value
    outside the subset (which `keyword` names), else a malformed schema."""

    def __init__(self, message: str, keyword: str | None = None, unsupported: bool = True):
        super().__init__(message)
        self.keyword = keyword
        self.unsupported = unsupported


# --- JSON text -------------------------------------------------------------------

# Whitespace is a rule of its own: inlined, its 17 states would be copied at every slot.
WS_RULE = "json:ws"
WS = Ref(WS_RULE)
COMMA = seq(lit(","), WS)
DIGIT = byte_range(0x30, 0x39)
NONZERO = byte_range(0x31, 0x39)
HEX = DIGIT | byte_range(0x41, 0x46) | byte_range(0x61, 0x66)
_CONT = byte_range(0x80, 0xBF)
_UTF8_MULTI = alt(
    seq(byte_range(0xC2, 0xDF), _CONT),
    seq(lit(b"\xe0"), byte_range(0xA0, 0xBF), _CONT),
    seq(byte_range(0xE1, 0xEC) | byte_range(0xEE, 0xEF), _CONT, _CONT),
    seq(lit(b"\xed"), byte_range(0x80, 0x9F), _CONT),
    seq(lit(b"\xf0"), byte_range(0x90, 0xBF), _CONT, _CONT),
    seq(byte_range(0xF1, 0xF3), _CONT, _CONT, _CONT),
    seq(lit(b"\xf4"), byte_range(0x80, 0x8F), _CONT, _CONT),
)
# One character of a string: printable ASCII but '"' and '\', an escape, or a UTF-8 sequence.
_JSON_UNIT = byte_range(0x20, 0x7F) - one_of('"\\')
_JSON_ESCAPE = seq(lit("\\"), alt(one_of('"\\/bfnrt'), seq(lit("u"), HEX, HEX, HEX, HEX)))
_JSON_WIDE = alt(_JSON_ESCAPE, _UTF8_MULTI)
CHAR = alt(_JSON_UNIT, _JSON_ESCAPE, _UTF8_MULTI)
STRING = seq(lit('"'), star(CHAR), lit('"'))
_UINT = alt(lit("0"), seq(NONZERO, repeat(DIGIT, 0, MAX_DIGITS - 1)))
INTEGER = seq(opt(lit("-")), _UINT)
_FRACTION = seq(lit("."), repeat(DIGIT, 1, MAX_DIGITS))
NUMBER = seq(INTEGER, opt(_FRACTION), opt(seq(one_of("eE"), opt(one_of("+-")), repeat(DIGIT, 1, 3))))
BOOLEAN = alt(lit("true"), lit("false"))
NULL = lit("null")


def _any_value_rules(syntax: str, ws: Expr, comma: Expr, key: Expr, string: Expr) -> dict[str, Expr]:
    """Rules `<syntax>:value` and `<syntax>:object`, any value and any object of a syntax
    with JSON's brackets, colons, numbers, booleans and null (nesting is recursion)."""
    value, obj = Ref(f"{syntax}:value"), Ref(f"{syntax}:object")

    def bracketed(opening: str, item: Expr, closing: str) -> Expr:
        return seq(lit(opening), ws, opt(seq(item, star(seq(comma, item)))), ws, lit(closing))
    return {obj.name: bracketed("{", seq(key, lit(":"), ws, value), "}"),
            value.name: alt(obj, bracketed("[", value, "]"), string, NUMBER, BOOLEAN, NULL)}


# Whitespace, any JSON value, and any JSON object, as rules.
VALUE_RULE, OBJECT_RULE = "json:value", "json:object"
JSON_RULES: dict[str, Expr] = {
    WS_RULE: opt(alt(lit(" "), seq(lit("\n"), repeat(lit(" "), 0, 16)))),
    **_any_value_rules("json", WS, COMMA, STRING, STRING),
}


def json_literal(value: Any) -> Expr:
    """Exactly this JSON value, as the grammar's layout writes it."""
    return lit(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


# --- string formats ----------------------------------------------------------------

def _two_digits(first: Expr, second: Expr = DIGIT) -> Expr:
    return seq(first, second)


_DATE = seq(DIGIT, DIGIT, DIGIT, DIGIT, lit("-"),
            alt(_two_digits(lit("0"), NONZERO), _two_digits(lit("1"), one_of("012"))), lit("-"),
            alt(_two_digits(lit("0"), NONZERO), _two_digits(one_of("12")),
                _two_digits(lit("3"), one_of("01"))))
_HOUR = alt(_two_digits(one_of("01")), _two_digits(lit("2"), one_of("0123")))
_MINUTE = _two_digits(byte_range(0x30, 0x35))
_TIME = seq(_HOUR, lit(":"), _MINUTE, lit(":"), _MINUTE, opt(seq(lit("."), repeat(DIGIT, 1, 6))),
            alt(lit("Z"), seq(one_of("+-"), _HOUR, lit(":"), _MINUTE)))
FORMATS: dict[str, Expr] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": seq(_DATE, lit("T"), _TIME),
    "uuid": seq(*([HEX] * 8), lit("-"), *([HEX] * 4), lit("-"), *([HEX] * 4), lit("-"),
                *([HEX] * 4), lit("-"), *([HEX] * 12)),
}


# --- integer and number ranges -------------------------------------------------------

def _digits_between(low: str, high: str) -> Expr:
    """Digit strings of one length from low to high (leading zeros as given).

    A first digit whose every tail fits joins the middle range ("1000".."3999" is
    [1-3] and three digits), which keeps the expression linear in the length."""
    if not low:
        return EMPTY
    if low[0] == high[0]:
        return seq(lit(low[0]), _digits_between(low[1:], high[1:]))
    rest = len(low) - 1
    low_full, high_full = low[1:] == "0" * rest, high[1:] == "9" * rest
    parts = []
    if not low_full:
        parts.append(seq(lit(low[0]), _digits_between(low[1:], "9" * rest)))
    first = ord(low[0]) if low_full else ord(low[0]) + 1
    last = ord(high[0]) if high_full else ord(high[0]) - 1
    if first <= last:
        parts.append(seq(byte_range(first, last), *([DIGIT] * rest)))
    if not high_full:
        parts.append(seq(lit(high[0]), _digits_between("0" * rest, high[1:])))
    return alt(*parts)


def uint_range(lo: int, hi: int | None) -> Expr:
    """Decimal integers lo..hi without sign or leading zeros (hi None: up to MAX_DIGITS digits)."""
    top = 10 ** MAX_DIGITS - 1
    hi = top if hi is None else min(hi, top)
    if lo > hi:
        return alt()
    parts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        first = max(lo, 10 ** (width - 1) if width > 1 else 0)
        last = min(hi, 10 ** width - 1)
        if first <= last:
            parts.append(_digits_between(str(first), str(last)))
    return alt(*parts)


def int_range(lo: int | None, hi: int | None) -> Expr:
    """Integers lo..hi (None: unbounded on that side)."""
    parts = []
    if lo is None or lo < 0:  # negatives: "-" and a magnitude
        smallest = 1 if hi is None or hi >= 0 else -hi
        parts.append(seq(lit("-"), uint_range(smallest, None if lo is None else -lo)))
    if hi is None or hi >= 0:
        parts.append(uint_range(max(lo or 0, 0), hi))
    return alt(*parts)


def _fraction(kind: str) -> Expr:
    if kind == "any":
        return opt(_FRACTION)
    if kind == "zero":
        return opt(seq(lit("."), repeat(lit("0"), 1, MAX_DIGITS)))
    return seq(lit("."), repeat(DIGIT, 0, MAX_DIGITS - 1), NONZERO)  # "nonzero"


def _magnitude(lo: int, lo_strict: bool, hi: int | None, hi_strict: bool) -> Expr:
    """Unsigned decimals m with lo <= m <= hi (< or > where strict); lo >= 0, hi None: unbounded."""
    if hi is not None and (hi < lo or (hi == lo and (lo_strict or hi_strict))):
        return alt()
    if hi is not None and hi == lo:
        return seq(uint_range(lo, lo), _fraction("zero"))
    parts = [seq(uint_range(lo, lo), _fraction("nonzero" if lo_strict else "any"))]
    inner_hi = None if hi is None else hi - 1
    if inner_hi is None or inner_hi >= lo + 1:
        parts.append(seq(uint_range(lo + 1, inner_hi), _fraction("any")))
    if hi is not None and not hi_strict:
        parts.append(seq(uint_range(hi, hi), _fraction("zero")))
    return alt(*parts)


def number_range(lo: int | None, lo_strict: bool, hi: int | None, hi_strict: bool) -> Expr:
    """Decimal numbers between whole-number bounds (None: unbounded), no exponent."""
    parts = []
    if lo is None or lo < 0:  # x = -m: x >= lo is m <= -lo, x <= hi < 0 is m >= -hi
        m_lo, m_lo_strict = (0, False) if hi is None or hi >= 0 else (-hi, hi_strict)
        parts.append(seq(lit("-"), _magnitude(m_lo, m_lo_strict, None if lo is None else -lo, lo_strict)))
    if hi is None or hi >= 0:
        low, low_strict = (0, False) if lo is None or lo < 0 else (lo, lo_strict)
        parts.append(_magnitude(low, low_strict, hi, hi_strict))
    return alt(*parts)


# --- schemas ---------------------------------------------------------------------

def _json_type(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _bad(message: str) -> SchemaError:
    return SchemaError(message, unsupported=False)


class SchemaCompiler:
    """Compiles JSON Schemas into rules of one grammar. Objects and arrays get a rule
    each (their members are calls), so optional members do not copy big subtrees;
    rule names start with `prefix`, so several schemas can share the grammar.

    Values are spelled as JSON; a subclass spells them otherwise by overriding the
    syntax hooks below (ws, comma, quoted, chars, key, any_key, literal, any_value,
    any_object): GemmaSchemaCompiler writes Gemma 4's call syntax."""

    ws: Expr = WS        # what may stand after { [ , : and before } ]
    comma: Expr = COMMA  # between members and items

    def __init__(self, rules: dict[str, Expr], prefix: str):
        self.rules = rules
        self.rules.update(JSON_RULES)  # compiled only if reached from the root
        self.prefix = prefix
        self.root: Any = None

    # --- syntax hooks --------------------------------------------------------------

    def quoted(self, body: Expr) -> Expr:
        """A string value whose characters are body."""
        return seq(lit('"'), body, lit('"'))

    def chars(self, lo: int, hi: int | None) -> Expr:
        """lo to hi characters of a string value (hi None: no limit)."""
        return repeat(CHAR, lo, hi)

    def key(self, name: str) -> Expr:
        """A declared property name, as a member's key."""
        return json_literal(name)

    def any_key(self) -> Expr:
        return STRING

    def literal(self, value: Any) -> Expr:
        """Exactly this value (enum, const)."""
        return json_literal(value)

    def compile_root(self, schema: Any) -> Expr:
        """The expression for a whole schema document ($ref "#" points at it)."""
        self.root = schema
        return self._named("#", schema, "")

    def any_value(self) -> Expr:
        return Ref(VALUE_RULE)

    def any_object(self) -> Expr:
        return Ref(OBJECT_RULE)

    # --- schemas -------------------------------------------------------------------

    def _named(self, key: str, schema: Any, path: str) -> Ref:
        name = f"{self.prefix}{key}"
        if name not in self.rules:
            self.rules[name] = EMPTY  # placeholder: the schema may refer to itself
            self.rules[name] = self.compile(schema, path)
        return Ref(name)

    def compile(self, schema: Any, path: str) -> Expr:
        """The expression for schema found at path (for messages)."""
        where = f" at {path.lstrip('.')}" if path else ""
        if schema is True:
            return self.any_value()
        if schema is False:
            raise _bad(f"the schema{where} is false, which no value satisfies")
        if not isinstance(schema, dict):
            raise _bad(f"the schema{where} must be an object or a boolean")
        for key in schema:
            if key not in _KEYWORDS:
                raise SchemaError(f"JSON Schema keyword '{key}'{where} is not supported", key)
        keywords = set(schema) - ANNOTATIONS
        for combinator in ("$ref", "allOf", "anyOf", "oneOf"):
            if combinator in keywords and keywords != {combinator}:
                other = sorted(keywords - {combinator})[0]
                raise SchemaError(f"JSON Schema keyword '{other}' next to '{combinator}'{where} is not "
                                  "supported", other)
        if "$ref" in schema:
            return self._ref(schema["$ref"], where)
        if "allOf" in schema:
            branches = self._branches(schema, "allOf", where)
            if len(branches) != 1:
                raise SchemaError(f"'allOf' with more than one schema{where} is not supported", "allOf")
            return self.compile(branches[0], f"{path}.allOf[0]")
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                branches = self._branches(schema, combinator, where)
                return alt(*(self.compile(b, f"{path}.{combinator}[{i}]") for i, b in enumerate(branches)))

        types = schema.get("type")
        if types is None:  # inferred from the keywords; bounds alone mean a number
            types = [t for t, words in _TYPE_KEYWORDS.items() if words & keywords and t != "integer"]
            if len(types) > 1:
                raise SchemaError(f"keywords of several types without 'type'{where} are not supported",
                                  "type")
        elif isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not all(t in _TYPE_KEYWORDS for t in types):
            raise _bad(f"'type'{where} must be one of {', '.join(_TYPE_KEYWORDS)} or a list of them")
        if "const" in schema or "enum" in schema:
            return self._enum(schema, types, where)
        if not types:
            return self.any_value()
        return alt(*(self._typed(t, schema, path, where) for t in dict.fromkeys(types)))

    def _branches(self, schema: dict, key: str, where: str) -> list:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise _bad(f"'{key}'{where} must be a non-empty array of schemas")
        return branches

    def _ref(self, target: Any, where: str) -> Expr:
        if not isinstance(target, str):
            raise _bad(f"'$ref'{where} must be a string")
        if target == "#":
            return Ref(f"{self.prefix}#")
        for container in ("$defs", "definitions"):
            head = f"#/{container}/"
            if target.startswith(head) and "/" not in target[len(head):]:
                key = target[len(head):].replace("~1", "/").replace("~0", "~")
                defs = self.root.get(container) if isinstance(self.root, dict) else None
                if not isinstance(defs, dict) or key not in defs:
                    raise _bad(f"'$ref' {target!r}{where} points at nothing")
                return self._named(target, defs[key], target[2:].replace("/", "."))
        raise SchemaError(f"'$ref' {target!r}{where} is not supported: only '#', '#/$defs/NAME' and "
                          "'#/definitions/NAME'", "$ref")

    def _enum(self, schema: dict, types: list[str], where: str) -> Expr:
        if "const" in schema:
            values = [schema["const"]]
        else:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise _bad(f"'enum'{where} must be a non-empty array")
        if "const" in schema and "enum" in schema:
            values = [v for v in values if v in schema["enum"]]
        if types:
            values = [v for v in values if _json_type(v) & set(types)]
        # The listed values are written as they are: of the keywords beside them, lengths
        # and bounds pick among them; the others would constrain inside a value.
        for key in ("format", "items", "minItems", "maxItems", "properties", "required", "additionalProperties"):
            if key in schema:
                raise SchemaError(f"'{key}' next to 'enum'/'const'{where} is not supported", key)
        values = [v for v in values if self._within(v, schema, where)]
        if not values:
            raise _bad(f"no value of 'enum'/'const'{where} fits the schema")
        return alt(*(self.literal(v) for v in values))

    def _within(self, value: Any, schema: dict, where: str) -> bool:
        """Whether a listed value keeps to its schema's lengths (a string's) or bounds (a number's)."""
        if isinstance(value, str):
            lo, hi = self._count(schema, "minLength", where) or 0, self._count(schema, "maxLength", where)
            return lo <= len(value) and (hi is None or len(value) <= hi)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        keeps = {"minimum": lambda b: value >= b, "maximum": lambda b: value <= b,
                 "exclusiveMinimum": lambda b: value > b, "exclusiveMaximum": lambda b: value < b}
        return all(keeps[key](bound) for key, bound in _bounds(schema, where).items())

    def _typed(self, kind: str, schema: dict, path: str, where: str) -> Expr:
        if kind == "string":
            return self._string(schema, where)
        if kind in ("integer", "number"):
            return self._number(kind, schema, where)
        if kind == "boolean":
            return BOOLEAN
        if kind == "null":
            return NULL
        if kind == "object":
            return self._rule(self._object(schema, path, where))
        return self._rule(self._array(schema, path, where))

    def _rule(self, expr: Expr) -> Ref:
        name = f"{self.prefix}{len(self.rules)}"
        self.rules[name] = expr
        return Ref(name)

    def _count(self, schema: dict, key: str, where: str) -> int | None:
        v = schema.get(key)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _bad(f"'{key}'{where} must be a non-negative integer")
        return v

    def _string(self, schema: dict, where: str) -> Expr:
        return self.quoted(self._string_body(schema, where, self.chars))

    def _string_body(self, schema: dict, where: str, chars: Callable[[int, int | None], Expr]) -> Expr:
        """The characters of a string schema's values, `chars(lo, hi)` for free text."""
        lo = self._count(schema, "minLength", where) or 0
        hi = self._count(schema, "maxLength", where)
        if hi is not None and hi < lo:
            raise _bad(f"'maxLength' is below 'minLength'{where}")
        fmt = schema.get("format")
        if fmt is None:
            return chars(lo, hi)
        if fmt not in FORMATS:
            raise SchemaError(f"'format' {fmt!r}{where} is not supported: only "
                              f"{', '.join(FORMATS)}", "format")
        if "minLength" in schema or "maxLength" in schema:
            raise SchemaError(f"'minLength'/'maxLength' with 'format'{where} are not supported", "maxLength")
        return FORMATS[fmt]

    def _number(self, kind: str, schema: dict, where: str) -> Expr:
        bounds = _bounds(schema, where)
        for key, v in bounds.items():
            if kind == "number" and v != int(v):
                raise SchemaError(f"'{key}' {v}{where}: bounds of a number must be whole numbers", key)
        if not bounds:
            return INTEGER if kind == "integer" else NUMBER
        lo, lo_strict = _tighter(bounds.get("minimum"), bounds.get("exclusiveMinimum"), max)
        hi, hi_strict = _tighter(bounds.get("maximum"), bounds.get("exclusiveMaximum"), min)
        if kind == "integer":
            lo_i = None if lo is None else (math.floor(lo) + 1 if lo_strict else math.ceil(lo))
            hi_i = None if hi is None else (math.ceil(hi) - 1 if hi_strict else math.floor(hi))
            if lo_i is not None and hi_i is not None and lo_i > hi_i:
                raise _bad(f"no integer lies between the bounds{where}")
            _check_writable(lo_i, lo_strict, hi_i, hi_strict, where)
            return int_range(lo_i, hi_i)
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict))):
            raise _bad(f"no number lies between the bounds{where}")
        _check_writable(lo, lo_strict, hi, hi_strict, where)
        return number_range(None if lo is None else int(lo), lo_strict,
                            None if hi is None else int(hi), hi_strict)

    def _object(self, schema: dict, path: str, where: str) -> Expr:
        members, extra = self._members(schema, path, where)
        if not members:
            if extra is False:
                return seq(lit("{"), self.ws, lit("}"))
            member = self._member(self.any_key(), self.compile(extra, f"{path}.additionalProperties"))
            return seq(lit("{"), self.ws, opt(seq(member, star(seq(self.comma, member)))), self.ws, lit("}"))
        compiled = [(self._member(self.key(name), self.compile(sub, f"{path}.properties.{name}")), req)
                    for name, sub, req in members]
        return seq(lit("{"), self.ws, self._ordered_members(compiled, self.comma), self.ws, lit("}"))

    def _member(self, key: Expr, value: Expr) -> Expr:
        return seq(key, lit(":"), self.ws, value)

    def _members(self, schema: dict, path: str, where: str) -> tuple[list[tuple[str, Any, bool]], Any]:
        """An object schema's (name, schema, required) members in declared order, the
        required names it does not declare last, and its additionalProperties."""
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise _bad(f"'properties'{where} must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _bad(f"'required'{where} must be an array of strings")
        extra = schema.get("additionalProperties", True)
        if not isinstance(extra, (bool, dict)):
            raise _bad(f"'additionalProperties'{where} must be a boolean or a schema")
        members = [(name, sub, name in required) for name, sub in props.items()]
        for name in dict.fromkeys(required):
            if name not in props:
                if extra is False:
                    raise _bad(f"required property {name!r}{where} is not allowed by 'additionalProperties'")
                members.append((name, extra, True))
        return members, extra

    def _ordered_members(self, members: list[tuple[Expr, bool]], comma: Expr) -> Expr:
        """Members in their declared order, optional ones skippable, `comma` between.

        With a required member, the optional ones before it carry their comma after
        them and the ones after it before them. Without one, the first member present
        is chosen, and what may follow member k is the same whichever came first: a
        rule per k, so the choices share it instead of copying it."""
        first = next((i for i, (_, req) in enumerate(members) if req), None)
        if first is not None:
            parts = [opt(seq(m, comma)) for m, _ in members[:first]]
            parts.append(members[first][0])
            parts += [seq(comma, m) if req else opt(seq(comma, m)) for m, req in members[first + 1:]]
            return seq(*parts)
        rest: Expr = EMPTY  # what may follow the last member
        choices = []
        for m, _ in reversed(members):
            choices.append(seq(m, rest))
            rest = self._rule(seq(opt(seq(comma, m)), rest))
        return opt(alt(*reversed(choices)))

    def _array(self, schema: dict, path: str, where: str) -> Expr:
        items = schema.get("items", True)
        if not isinstance(items, (bool, dict)):
            raise SchemaError(f"'items' as an array (tuple validation){where} is not supported", "items")
        lo = self._count(schema, "minItems", where) or 0
        hi = self._count(schema, "maxItems", where)
        if hi is not None and hi < lo:
            raise _bad(f"'maxItems' is below 'minItems'{where}")
        if hi == 0:
            return seq(lit("["), self.ws, lit("]"))
        item = self.compile(items, f"{path}.items")
        body = seq(item, repeat(seq(self.comma, item), max(lo - 1, 0), None if hi is None else hi - 1))
        return seq(lit("["), self.ws, body if lo > 0 else opt(body), self.ws, lit("]"))


def _bounds(schema: dict, where: str) -> dict[str, int | float]:
    """A schema's numeric bounds (minimum, maximum and their exclusive forms) that it
    gives, each a finite number, else malformed."""
    bounds = {}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = schema.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _bad(f"'{key}'{where} must be a number")
        bounds[key] = v
    return bounds


def _check_writable(lo: float | None, lo_strict: bool, hi: float | None, hi_strict: bool, where: str) -> None:
    """Refuse bounds that leave no number of at most MAX_DIGITS integer digits."""
    limit = 10 ** MAX_DIGITS
    for key, bound, out in (("exclusiveMinimum" if lo_strict else "minimum", lo, lo is not None and lo >= limit),
                            ("exclusiveMaximum" if hi_strict else "maximum", hi, hi is not None and hi <= -limit)):
        if out:
            raise SchemaError(f"'{key}' {bound:g}{where} is not supported: numbers are written with at most "
                              f"{MAX_DIGITS} integer digits", key)


def _tighter(inclusive: float | None, exclusive: float | None, pick) -> tuple[float | None, bool]:
    """The binding bound of an inclusive and an exclusive one: (value, strict)."""
    if inclusive is None:
        return exclusive, exclusive is not None
    if exclusive is None:
        return inclusive, False
    best = pick(inclusive, exclusive)
    return best, best == exclusive


# --- other spellings of the same values ---------------------------------------------

# Raw text (Gemma 4's strings, Qwen3-Coder's and GLM-4.5's string parameters): printable and wide
# characters, newline and tab, with "<" wherever no marker begins (text_without).
# With a length bound, no "<" at all (_TEXT_CHAR), so that the bound counts characters.
_TEXT_UNIT = byte_range(0x20, 0x7E) | one_of("\n\t")
_TEXT_CHAR = alt(_TEXT_UNIT - one_of("<"), _UTF8_MULTI)


def _check_spelling(markers: tuple[str, ...], text: str, what: str, keyword: str) -> None:
    """Refuse a fixed string (an enum value, a property name) that would spell a marker."""
    marker = next((m for m in markers if m in text), None)
    if marker is not None:
        raise SchemaError(f"the {what} {text!r} holds {marker!r}, which cannot be written in this "
                          "model's tool calls", keyword)


class GemmaSchemaCompiler(SchemaCompiler):
    """Values in the syntax Gemma 4 writes a call's arguments in (llmd.prompt.tool_calls.gemma_calls
    reads it): `{key:value,...}` with bare keys in the template's order (_members),
    `[a,b]`, a string between two `quote` marks (the model's <|"|> token, or its
    spelling), numbers, true, false and null bare, and no whitespace. `markers` are the
    spellings that would end a string or the call in the parser's eyes (the quote's, the
    call's closing): no string holds them; a key the parser could not read bare (empty,
    with whitespace or one of `:,{}[]<`) is quoted."""

    ws = EMPTY
    comma = lit(",")

    def __init__(self, rules: dict[str, Expr], prefix: str, quote: Expr, markers: tuple[str, ...]):
        super().__init__(rules, prefix)
        self.quote, self.markers = quote, markers
        # free text is a rule: inlined, its marker-avoiding states would be copied at every string
        self.rules["gemma:text"] = text_without(markers, _TEXT_UNIT, _UTF8_MULTI)
        self.rules.update(_any_value_rules("gemma", EMPTY, self.comma, self.any_key(),
                                           self.quoted(self.chars(0, None))))

    def _members(self, schema: dict, path: str, where: str) -> tuple[list[tuple[str, Any, bool]], Any]:
        """Members in the order Gemma 4's template writes a call's arguments (dictsort:
        by name, ignoring case), so a call the model made renders back into the prompt
        as it was written and the session's cache stays warm."""
        members, extra = super()._members(schema, path, where)
        return sorted(members, key=lambda member: member[0].lower()), extra

    def quoted(self, body: Expr) -> Expr:
        return seq(self.quote, body, self.quote)

    def chars(self, lo: int, hi: int | None) -> Expr:
        return Ref("gemma:text") if lo == 0 and hi is None else repeat(_TEXT_CHAR, lo, hi)

    def key(self, name: str) -> Expr:
        _check_spelling(self.markers, name, "property name", "properties")
        if name and not any(c.isspace() or c in ':,{}[]<' for c in name):
            return lit(name)
        return self.literal(name)

    def any_key(self) -> Expr:
        return seq(one_of("_") | byte_range(0x41, 0x5A) | byte_range(0x61, 0x7A),
                   star(one_of("_") | byte_range(0x41, 0x5A) | byte_range(0x61, 0x7A) | DIGIT))

    def literal(self, value: Any) -> Expr:
        if isinstance(value, str):
            _check_spelling(self.markers, value, "value", "enum")
            return self.quoted(lit(value))
        if isinstance(value, dict):
            ordered = sorted(value.items(), key=lambda item: item[0].lower())
            items = [seq(self.key(k), lit(":"), self.literal(v)) for k, v in ordered]
            return seq(lit("{"), *_joined(items, self.comma), lit("}"))
        if isinstance(value, list):
            return seq(lit("["), *_joined([self.literal(v) for v in value], self.comma), lit("]"))
        return json_literal(value)

    def any_value(self) -> Expr:
        return Ref("gemma:value")

    def any_object(self) -> Expr:
        return Ref("gemma:object")


def _joined(items: list[Expr], separator: Expr) -> list[Expr]:
    return [part for i, item in enumerate(items) for part in ((separator, item) if i else (item,))]


class MarkedJsonCompiler(SchemaCompiler):
    """JSON whose strings never spell one of `markers`: the spellings that end a call's
    arguments early in its family's parser (harmony's <|end|>, Mistral's [TOOL_CALLS],
    Phi-4's <|/tool_call|>), whether the model writes them as a token or as text. A
    string with a length bound holds none of the markers' first character at all, so
    that the bound counts characters; JSON can escape it."""

    def __init__(self, rules: dict[str, Expr], prefix: str, markers: tuple[str, ...]):
        super().__init__(rules, prefix)
        self.markers = markers
        # string characters are a rule: inlined, their marker-avoiding states would be
        # copied at every string
        self.rules["marked:chars"] = text_without(markers, _JSON_UNIT, _JSON_WIDE)
        self.rules.update(_any_value_rules("marked", WS, COMMA, self.any_key(), self.any_key()))

    def chars(self, lo: int, hi: int | None) -> Expr:
        if lo == 0 and hi is None:
            return Ref("marked:chars")
        return repeat(alt(_JSON_UNIT - one_of(self.markers[0][0]), _JSON_WIDE), lo, hi)

    def any_key(self) -> Expr:
        return self.quoted(self.chars(0, None))

    def key(self, name: str) -> Expr:
        _check_spelling(self.markers, json.dumps(name, ensure_ascii=False), "property name", "properties")
        return super().key(name)

    def literal(self, value: Any) -> Expr:
        _check_spelling(self.markers, json.dumps(value, ensure_ascii=False), "value", "enum")
        return super().literal(value)

    def any_value(self) -> Expr:
        return Ref("marked:value")

    def any_object(self) -> Expr:
        return Ref("marked:object")


_XML_NAME = re.compile(r"[^>\n]+")


class XmlParameterCompiler(MarkedJsonCompiler):
    """Qwen3-Coder's call body for a tool's parameters (llmd.prompt.tool_calls.decode_call reads it):
    each argument `<parameter=NAME>` newline VALUE newline `</parameter>` newline, the
    declared ones in declared order (optional ones skippable; without properties, any
    names). VALUE is raw text where a declared property's own type is "string" (the
    parser, llmd.prompt.tool_calls.string_params, keeps exactly those as text), else JSON.
    `markers` end a value in the parser's eyes (`</parameter>`, `</tool_call>`): neither
    raw text nor a JSON string spells them (JSON can escape the "/" or the "<")."""

    family = "Qwen3-Coder's XML calls"

    def __init__(self, rules: dict[str, Expr], prefix: str, markers: tuple[str, ...]):
        super().__init__(rules, prefix, markers)
        # free text is a rule for the same reason as the JSON string characters
        self.rules["xml:text"] = text_without(markers, _TEXT_UNIT, _UTF8_MULTI)

    def compile_root(self, schema: Any) -> Expr:
        self.root = schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise SchemaError("parameters other than an object with 'properties' are not supported "
                              f"in {self.family}", "type")
        for key in schema:
            if key not in ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}:
                raise SchemaError(f"JSON Schema keyword '{key}' of the parameters is not supported "
                                  f"in {self.family}", key)
        members, extra = self._members(schema, "", "")
        for name, _, _ in members:
            if not _XML_NAME.fullmatch(name):
                raise SchemaError(f"the parameter name {name!r} cannot be written in {self.family}", "properties")
        if not members:
            if extra is False:
                return EMPTY
            letter = alt(_TEXT_UNIT - one_of("<>\n"), _UTF8_MULTI)
            name = seq(letter, star(letter))
            return star(self._parameter(name, self.compile(extra, "additionalProperties")))
        declared = schema.get("properties", {})
        return self._ordered_members(
            [(self._parameter(lit(name), self._value(sub, f"properties.{name}", name in declared)), req)
             for name, sub, req in members], EMPTY)

    def _parameter(self, name: Expr, value: Expr) -> Expr:
        return seq(lit("<parameter="), name, lit(">\n"), value, lit("\n</parameter>\n"))

    def _value(self, schema: Any, path: str, declared: bool) -> Expr:
        """A parameter's value: raw text for a declared property of type "string"
        (only those does the parser know to keep as text), else JSON."""
        value = self.compile(schema, path)  # also checks the schema
        if not (declared and isinstance(schema, dict) and schema.get("type") == "string"):
            return value
        where = f" at {path}"
        if "const" in schema or "enum" in schema:
            values = [v for v in ([schema["const"]] if "const" in schema else schema["enum"])
                      if isinstance(v, str) and ("enum" not in schema or v in schema["enum"])]
            for v in values:
                _check_spelling(self.markers, v, "value", "enum")
            return alt(*(lit(v) for v in values))
        return self._string_body(schema, where, lambda lo, hi: Ref("xml:text") if lo == 0 and hi is None
                                 else repeat(_TEXT_CHAR, lo, hi))


class GlmParameterCompiler(XmlParameterCompiler):
    """GLM-4.5's call body for a tool's parameters (llmd.prompt.tool_calls.decode_call reads it),
    as XmlParameterCompiler's with each argument `<arg_key>NAME</arg_key>` newline
    `<arg_value>VALUE</arg_value>` newline, the tags spelled by `write` (as the model's
    tokens where they are its control tokens). `markers` (`</arg_value>`, `</tool_call>`)
    end a value in the parser's eyes."""

    family = "GLM-4.5's XML calls"

    def __init__(self, rules: dict[str, Expr], prefix: str, markers: tuple[str, ...], write: Callable[[str], Expr]):
        super().__init__(rules, prefix, markers)
        self.write = write

    def _parameter(self, name: Expr, value: Expr) -> Expr:
        return seq(self.write("<arg_key>"), name, self.write("</arg_key>\n<arg_value>"), value,
                   self.write("</arg_value>\n"))
