"""llmd/structured/jsonschema.py: JSON and JSON Schema as grammars, checked by running the compiled
automaton (llmd_grammar_match) over texts that must be accepted or refused."""
import json
import random
from fractions import Fraction

import pytest

from llmd.engine.native import grammar_match
from llmd.structured.grammar import GrammarError, compile_grammar, lit
from llmd.structured.jsonschema import SchemaCompiler, SchemaError, int_range, number_range, uint_range
from tests.support.schema_validator import errors


def grammar_of(schema):
    """text -> whether it is a whole value of schema in the grammar's layout."""
    rules = {}
    rules["root"] = SchemaCompiler(rules, "s:").compile_root(schema)
    text = compile_grammar(rules, "root")
    return lambda value: grammar_match(text, value if isinstance(value, bytes) else value.encode()) >= 2


def expr_matcher(expr):
    text = compile_grammar({"root": expr}, "root")
    return lambda value: grammar_match(text, value.encode()) >= 2


# --- any JSON -----------------------------------------------------------------------

ANY_OK = ['{"a": [1, 2.5, -3e+10, true, false, null, "x\\n\\u00e9\\"", {}]}', "[]", '"é€😀"', "0",
          '{\n  "a": {\n    "b": [\n      1\n    ]\n  }\n}', '{ "a": 1 }', "-0.5E-7", '{"":""}']
ANY_BAD = ['{"a": 1,}', "{'a': 1}", '{\n\n  "a": 1}', '{  "a": 1}', "[1 ,2]", '"\x01"', b'"\xff"',
           b'"\xc0\xaf"', "01", "1.", ".5", "NaN", '{"a" : 1}', "[1,\t2]", '"\\x"', "1e1234",
           "1" * 17, "0." + "1" * 17]


@pytest.mark.parametrize("text", ANY_OK)
def test_any_json_value_is_accepted_in_the_layout(text):
    assert grammar_of(True)(text)
    json.loads(text)


@pytest.mark.parametrize("text", ANY_BAD)
def test_whitespace_numbers_strings_and_syntax_outside_the_layout_are_refused(text):
    assert not grammar_of({})(text)


# --- objects ------------------------------------------------------------------------

def test_properties_come_in_declared_order_required_ones_always():
    ok = grammar_of({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                      "c": {"type": "boolean"}}, "required": ["a", "c"]})
    assert ok('{"a": 1, "c": true}') and ok('{"a": 1, "b": "x", "c": false}')
    assert not ok('{"a": 1}')                      # c is required
    assert not ok('{"c": true, "a": 1}')           # declared order
    assert not ok('{"a": 1, "c": true, "d": 1}')   # no extra keys next to properties
    assert not ok('{"a": "1", "c": true}')         # types hold


def test_all_optional_properties_allow_any_ordered_subset():
    ok = grammar_of({"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}})
    for text in ['{}', '{"b": 1}', '{"a": 1, "c": 2}', '{"a": 1, "b": 2, "c": 3}']:
        assert ok(text), text
    assert not ok('{, "b": 1}') and not ok('{"b": 1, "a": 2}') and not ok('{"a": 1, "a": 2}')


def test_optional_members_grow_the_grammar_linearly():
    def states(n):
        rules = {}
        schema = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(n)}}
        rules["root"] = SchemaCompiler(rules, "s:").compile_root(schema)
        return int(compile_grammar(rules, "root").split()[2])
    assert states(20) - states(10) == states(30) - states(20)  # a constant cost per member


def test_additional_properties_shape_objects_without_properties():
    ints = grammar_of({"type": "object", "additionalProperties": {"type": "integer"}})
    assert ints('{"x": 1, "y": 2}') and not ints('{"x": "1"}')
    assert grammar_of({"type": "object", "additionalProperties": False})("{}")
    assert not grammar_of({"type": "object", "additionalProperties": False})('{"x": 1}')
    assert grammar_of({"type": "object"})('{"x": [null]}')


def test_required_key_without_a_property_schema_takes_any_value():
    ok = grammar_of({"type": "object", "required": ["id"]})
    assert ok('{"id": [1]}') and not ok("{}")


# --- scalars ------------------------------------------------------------------------

def test_string_lengths_count_characters_not_bytes():
    ok = grammar_of({"type": "string", "minLength": 2, "maxLength": 3})
    assert [ok(t) for t in ['"a"', '"ab"', '"é\\né"', '"abcd"']] == [False, True, True, False]


@pytest.mark.parametrize("fmt, good, bad", [
    ("date", "2024-02-29", "2024-13-01"),
    ("time", "23:59:59.123+02:00", "24:00:00Z"),
    ("date-time", "1999-12-31T23:59:59Z", "1999-12-31 23:59:59Z"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
])
def test_string_formats(fmt, good, bad):
    ok = grammar_of({"type": "string", "format": fmt})
    assert ok(json.dumps(good)) and not ok(json.dumps(bad))


def test_enum_const_and_type_lists():
    ok = grammar_of({"enum": ["red", 1, None, {"a": [True]}]})
    assert all(ok(json.dumps(v, separators=(", ", ": "))) for v in ["red", 1, None, {"a": [True]}])
    assert not ok('"blue"') and not ok("2")
    assert grammar_of({"type": "string", "enum": ["a", 1]})('"a"')
    assert not grammar_of({"type": "string", "enum": ["a", 1]})("1")  # filtered by type
    assert grammar_of({"const": "x"})('"x"') and not grammar_of({"const": "x"})('"y"')
    either = grammar_of({"type": ["string", "null"]})
    assert either('"s"') and either("null") and not either("1")


def test_unsigned_integer_ranges_match_python():
    for lo, hi in [(0, 0), (5, 123), (99, 1000), (3, 40007), (123, None)]:
        ok = expr_matcher(uint_range(lo, hi))
        for v in list(range(0, 1100, 7)) + [40006, 40007, 40008, 10**15]:
            assert ok(str(v)) == (v >= lo and (hi is None or v <= hi)), (lo, hi, v)
        assert not ok("007")


def test_signed_integer_ranges_match_python():
    for lo, hi in [(-5, 5), (None, -3), (-100, None), (-12, -3), (None, None)]:
        ok = expr_matcher(int_range(lo, hi))
        for v in range(-130, 130, 3):
            assert ok(str(v)) == ((lo is None or v >= lo) and (hi is None or v <= hi)), (lo, hi, v)


def test_integer_bounds_of_a_schema_include_exclusive_and_fractional_ones():
    ok = grammar_of({"type": "integer", "exclusiveMinimum": 0, "maximum": 9.5})
    assert [ok(str(v)) for v in (0, 1, 9, 10)] == [False, True, True, False]


def test_bounds_at_the_largest_written_magnitude_are_kept():
    top = 10 ** 16 - 1  # 16 integer digits, the most a number is written with
    assert grammar_of({"type": "integer", "minimum": top})(str(top))
    assert grammar_of({"type": "number", "exclusiveMinimum": top})(f"{top}.5")
    assert grammar_of({"type": "integer", "maximum": -top})(str(-top))


@pytest.mark.parametrize("lo, lo_strict, hi, hi_strict", [
    (0, False, 1, False), (0, True, None, False), (-2, False, 3, True), (None, False, -1, True),
    (-5, True, -2, False), (0, True, 1, True)])
def test_number_ranges_accept_only_values_inside(lo, lo_strict, hi, hi_strict):
    ok = expr_matcher(number_range(lo, lo_strict, hi, hi_strict))
    rng = random.Random(5)
    for _ in range(400):
        text = str(rng.randint(-8, 8)) if rng.random() < 0.3 else repr(round(rng.uniform(-8, 8), rng.randint(1, 3)))
        v = Fraction(text)
        inside = ((lo is None or (v > lo if lo_strict else v >= lo))
                  and (hi is None or (v < hi if hi_strict else v <= hi)))
        if ok(text):
            assert inside, text
        else:  # a value inside may be refused only for an unusual spelling
            assert not inside or text.startswith("-0"), text


# --- arrays and combinators ------------------------------------------------------------

def test_array_items_and_counts():
    ok = grammar_of({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})
    assert [ok(t) for t in ["[]", "[1]", "[1, 2, 3]", "[1, 2, 3, 4]", '["1"]']] == [False, True, True, False, False]
    assert grammar_of({"type": "array", "maxItems": 0})("[]")


def test_any_of_one_of_all_of_and_refs():
    ok = grammar_of({"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/name"}],
                     "$defs": {"name": {"type": "string", "maxLength": 3}}})
    assert ok("7") and ok('"abc"') and not ok('"abcd"')
    assert grammar_of({"oneOf": [{"const": 1}, {"const": 2}]})("2")
    assert grammar_of({"allOf": [{"type": "boolean"}], "title": "flag"})("true")


def test_recursive_schemas_nest():
    tree = {"type": "object", "properties": {"v": {"type": "integer"},
                                             "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["v"]}
    ok = grammar_of(tree)
    assert ok('{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}')
    assert not ok('{"v": 1, "kids": [{"kids": []}]}')
    defs = {"$defs": {"list": {"anyOf": [{"type": "null"},
                                         {"type": "array", "items": {"$ref": "#/definitions/x"}}]}},
            "definitions": {"x": {"$ref": "#/$defs/list"}}, "$ref": "#/$defs/list"}
    assert grammar_of(defs)("[[null], []]")


def test_a_ref_that_reads_nothing_before_itself_is_refused():
    with pytest.raises(GrammarError):
        grammar_of({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})


def test_annotations_are_ignored():
    ok = grammar_of({"type": "string", "title": "T", "description": "D", "default": "x",
                     "examples": ["y"], "$comment": "c", "deprecated": False})
    assert ok('"z"')


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "pattern": "a+"}, "pattern"),
    ({"type": "number", "multipleOf": 2}, "multipleOf"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "array", "prefixItems": [{}]}, "prefixItems"),
    ({"not": {"type": "null"}}, "not"),
    ({"type": "string", "format": "email"}, "format"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf"),
    ({"type": "number", "minimum": 0.5}, "minimum"),
    ({"type": "array", "items": [{"type": "string"}]}, "items"),
    ({"type": "integer", "minimum": 10 ** 16}, "minimum"),  # beyond 16 integer digits
    ({"type": "number", "exclusiveMinimum": 1e300}, "exclusiveMinimum"),
    ({"type": "integer", "maximum": -1e17}, "maximum"),
    ({"type": "number", "maximum": -10 ** 20}, "maximum"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}, "pattern"),
    ({"anyOf": [{}], "type": "string"}, "type"),
])
def test_keywords_outside_the_subset_are_named(schema, keyword):
    with pytest.raises(SchemaError) as info:
        grammar_of(schema)
    assert info.value.unsupported and info.value.keyword == keyword and f"'{keyword}'" in str(info.value)


@pytest.mark.parametrize("schema", [
    False, 3, {"type": "strin"}, {"type": "object", "required": "a"}, {"type": "array", "minItems": -1},
    {"type": "array", "minItems": 3, "maxItems": 2}, {"enum": []}, {"$ref": "#/$defs/missing"},
    {"type": "integer", "minimum": 5, "maximum": 4}, {"type": "string", "enum": [1]},
    {"type": "object", "required": ["x"], "additionalProperties": False},
])
def test_malformed_or_unsatisfiable_schemas_are_invalid(schema):
    with pytest.raises(SchemaError) as info:
        grammar_of(schema)
    assert not info.value.unsupported


def test_listed_values_keep_to_the_lengths_and_bounds_beside_them():
    ok = grammar_of({"type": "integer", "minimum": 5, "enum": [1, 5, 7], "exclusiveMaximum": 7})
    assert [ok(v) for v in ("1", "5", "7")] == [False, True, False]
    ok = grammar_of({"type": "string", "maxLength": 4, "enum": ["tiny", "enormous"]})
    assert [ok(v) for v in ('"tiny"', '"enormous"')] == [True, False]
    with pytest.raises(SchemaError) as info:  # no listed value is short enough
        grammar_of({"type": "string", "const": "enormous", "maxLength": 4})
    assert not info.value.unsupported


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "format": "date", "const": "x"}, "format"),
    ({"type": "array", "items": {"type": "integer"}, "enum": [["a"]]}, "items"),
    ({"type": "object", "required": ["a"], "const": {}}, "required"),
])
def test_keywords_inside_listed_values_are_refused_not_ignored(schema, keyword):
    with pytest.raises(SchemaError) as info:
        grammar_of(schema)
    assert info.value.unsupported and info.value.keyword == keyword


def test_the_independent_validator_agrees_on_accepted_values():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": -3, "maximum": 3},
                                               "s": {"enum": ["x", "y"]}}, "required": ["n"]}
    ok = grammar_of(schema)
    for n in range(-5, 6):
        for s in (None, "x", "z"):
            value = {"n": n} if s is None else {"n": n, "s": s}
            assert ok(json.dumps(value)) == (not errors(value, schema)), value


# --- Gemma 4's call syntax and Qwen3-Coder's XML parameters --------------------------------

GEMMA_MARKERS = ('<|"|>', "<tool_call|>")
WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "maxLength": 6}, "note": {"type": "string"},
    "days": {"type": "integer", "minimum": 1, "maximum": 9}, "units": {"enum": ["c", "f"]},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}, "ok": {"type": "boolean"}}},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}, "any": {}}}


def gemma_grammar_of(schema):
    from llmd.structured.jsonschema import GemmaSchemaCompiler
    rules = {}
    rules["root"] = GemmaSchemaCompiler(rules, "g:", lit('<|"|>'), GEMMA_MARKERS).compile_root(schema)
    text = compile_grammar(rules, "root")
    return lambda value: grammar_match(text, value.encode()) >= 2


def gemma_spelled(value):
    """A value as Gemma 4's template writes a call's arguments (bare keys, <|"|> strings)."""
    if isinstance(value, str):
        return '<|"|>' + value + '<|"|>'
    if isinstance(value, dict):  # sorted by name ignoring case, as the template's dictsort does
        ordered = sorted(value.items(), key=lambda item: item[0].lower())
        return "{" + ",".join(f"{k}:{gemma_spelled(v)}" for k, v in ordered) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_spelled(v) for v in value) + "]"
    return json.dumps(value)


@pytest.mark.parametrize("value", [
    {"city": "Oslo"}, {"city": "", "note": "a <b> c, {d}: [e]\n\u00e9"}, {"city": "x", "days": 9, "units": "f"},
    {"city": "Rome", "where": {"lat": -1.5, "ok": False}, "tags": ["a", "b"]},
    {"city": "Rome", "any": {"k": [1, None, "s", {"n": True}]}}, {"city": "Rome", "any": None},
])
def test_gemma_syntax_accepts_the_templates_spelling_and_the_parser_reads_it_back(value):
    from llmd.prompt.tool_calls import gemma_calls
    spelled = gemma_spelled(value)
    assert gemma_grammar_of(WEATHER)(spelled), spelled
    (call,) = gemma_calls("call:get_weather" + spelled, frozenset({"get_weather"}))
    assert json.loads(call[1]) == value and not errors(value, WEATHER)


@pytest.mark.parametrize("text", [
    '{"city":"Oslo"}', '{city: <|"|>Oslo<|"|>}', '{ city:<|"|>Oslo<|"|>}', '{city:<|"|>Oslo<|"|>,}',
    '{city:<|"|>Oslo!!!<|"|>}',                     # longer than maxLength
    '{city:<|"|>a<b<|"|>}',                         # a bounded string holds no "<"
    '{city:<|"|>x<|"|>,note:<|"|>a<tool_call|>b<|"|>}', '{city:<|"|>x<|"|>,note:<|"|>a<|"|>b<|"|>}',
    '{days:1,city:<|"|>x<|"|>}',                    # the template's order: sorted by name
    '{city:<|"|>x<|"|>,units:<|"|>k<|"|>}', '{city:<|"|>x<|"|>,days:10}', '{city:Oslo}',
])
def test_gemma_syntax_refuses_what_the_parser_would_misread_or_the_schema_forbids(text):
    assert not gemma_grammar_of(WEATHER)(text)


def test_gemma_keys_the_parser_cannot_read_bare_are_quoted_and_markers_in_values_are_refused():
    from llmd.prompt.tool_calls import gemma_calls
    schema = {"type": "object", "properties": {"a b:c": {"type": "integer"}}, "required": ["a b:c"]}
    assert gemma_grammar_of(schema)('{<|"|>a b:c<|"|>:1}') and not gemma_grammar_of(schema)("{a b:c:1}")
    assert json.loads(gemma_calls('call:f{<|"|>a b:c<|"|>:1}', frozenset({"f"}))[0][1]) == {"a b:c": 1}
    with pytest.raises(SchemaError) as info:
        gemma_grammar_of({"enum": ['say <|"|>']})
    assert info.value.keyword == "enum"


def xml_grammar_of(schema, glm=False):
    from llmd.structured.jsonschema import GlmParameterCompiler, XmlParameterCompiler
    rules = {}
    if glm:
        compiler = GlmParameterCompiler(rules, "x:", ("</arg_value>", "</tool_call>"), lit)
    else:
        compiler = XmlParameterCompiler(rules, "x:", ("</parameter>", "</tool_call>"))
    rules["root"] = compiler.compile_root(schema)
    text = compile_grammar(rules, "root")
    return lambda value: grammar_match(text, value.encode()) >= 2


def xml_spelled(arguments, strings, glm=False):
    """Arguments as Qwen3-Coder's (or GLM-4.5's) template writes them, JSON for what is
    not a string parameter."""
    def value(k, v):
        return v if k in strings else json.dumps(v, ensure_ascii=False)
    if glm:
        return "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{value(k, v)}</arg_value>\n" for k, v in arguments.items())
    return "".join(f"<parameter={k}>\n{value(k, v)}\n</parameter>\n" for k, v in arguments.items())


@pytest.mark.parametrize("glm", [False, True])
@pytest.mark.parametrize("value", [
    {"city": "Oslo"}, {"city": "", "note": "line one\n<b>two</b>\n", "days": 3, "units": "c"},
    {"city": "Rome", "where": {"lat": 1.5}, "tags": ["x", "</b>"], "any": {"k": ["v"]}},
])
def test_xml_parameters_accept_the_templates_spelling_and_the_parser_reads_it_back(value, glm):
    from llmd.prompt.tool_calls import decode_call, string_params
    tools = [{"name": "get_weather", "parameters": WEATHER}]
    strings = {p for _, p in string_params(tools)}
    spelled = xml_spelled(value, strings, glm)
    assert xml_grammar_of({**WEATHER, "type": "object"}, glm)(spelled), spelled
    body = f"get_weather\n{spelled}" if glm else f"\n<function=get_weather>\n{spelled}</function>\n"
    name, arguments = decode_call(body, frozenset({"get_weather"}), string_params(tools))
    assert json.loads(arguments) == value and not errors(value, WEATHER)


def test_glm_values_never_spell_the_tags_that_end_them():
    ok = xml_grammar_of({"type": "object", "properties": {"note": {"type": "string"}, "tags": {"type": "array"}}},
                        glm=True)
    assert ok("<arg_key>note</arg_key>\n<arg_value>a <b>c</b></arg_value>\n")
    assert not ok("<arg_key>note</arg_key>\n<arg_value>a </arg_value> b</arg_value>\n")
    assert not ok("<arg_key>note</arg_key>\n<arg_value>a </tool_call></arg_value>\n")
    assert ok('<arg_key>tags</arg_key>\n<arg_value>["<\\/arg_value>"]</arg_value>\n')
    assert not ok('<arg_key>tags</arg_key>\n<arg_value>["</arg_value>"]</arg_value>\n')


def test_xml_raw_text_only_for_declared_string_properties():
    """The parser keeps text only for declared string properties: a required name that
    additionalProperties types as a string is written as JSON, or it would come back a number."""
    from llmd.prompt.tool_calls import decode_call, string_params
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"],
              "additionalProperties": {"type": "string"}}
    ok = xml_grammar_of(schema)
    assert ok('<parameter=a>\n123\n</parameter>\n<parameter=b>\n"123"\n</parameter>\n')
    assert not ok("<parameter=a>\n123\n</parameter>\n<parameter=b>\n123\n</parameter>\n")
    body = '<function=f>\n<parameter=a>\n123\n</parameter>\n<parameter=b>\n"123"\n</parameter>\n</function>'
    strings = string_params([{"name": "f", "parameters": schema}])
    assert decode_call(body, frozenset({"f"}), strings) == ("f", '{"a": "123", "b": "123"}')


def test_xml_json_values_write_a_marker_only_escaped():
    from llmd.prompt.tool_calls import decode_call
    ok = xml_grammar_of({"type": "object", "properties": {"tags": {"type": "array"}}})
    text = '<parameter=tags>\n["<\\/parameter>"]\n</parameter>\n'
    assert ok(text) and not ok(text.replace("\\/", "/"))
    assert decode_call(f"<function=f>\n{text}</function>", frozenset({"f"})) == ("f", '{"tags": ["</parameter>"]}')


@pytest.mark.parametrize("text", [
    "<parameter=city>\nOs</parameter>lo\n</parameter>\n",        # raw text ends at </parameter>
    "<parameter=city>\nOs</tool_call>\n</parameter>\n",
    "<parameter=city>\nToo long\n</parameter>\n",
    "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n\"3\"\n</parameter>\n",  # an integer is JSON
    "<parameter=days>\n3\n</parameter>\n<parameter=city>\nOslo\n</parameter>\n",     # declared order
    "<parameter=note>\nx\n</parameter>\n",                                           # city is required
    "<parameter=city>\nOslo</parameter>\n",
    '<parameter=city>\nx\n</parameter>\n<parameter=tags>\n["</parameter>"]\n</parameter>\n',  # nor does JSON
    '<parameter=city>\nx\n</parameter>\n<parameter=any>\n{"</tool_call>": 1}\n</parameter>\n',
])
def test_xml_parameters_refuse_what_the_parser_would_misread_or_the_schema_forbids(text):
    assert not xml_grammar_of({**WEATHER, "type": "object"})(text)


@pytest.mark.parametrize("schema, keyword", [
    ({"anyOf": [{"type": "object"}]}, "type"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "object", "properties": {"a>b": {}}}, "properties"),
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["x</parameter>"]}}}, "enum"),
    ({"type": "object", "properties": {"a": {"enum": [1, "x</tool_call>"]}}}, "enum"),        # as JSON too
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"</parameter>": {}}}}}, "properties"),
])
def test_xml_parameters_refuse_what_they_cannot_write(schema, keyword):
    with pytest.raises(SchemaError) as info:
        xml_grammar_of(schema)
    assert info.value.keyword == keyword and info.value.unsupported
