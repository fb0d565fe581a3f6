"""Tests for llmd/prompt/jinja/: the chat-template interpreter.

Expected strings below are what Jinja2 3.1.6 prints for the same source and values in
transformers' chat-template environment (checked once with jinja2; it is not imported
here). The reference suite renders every template of llama.cpp's models/templates/
against tests/data/template_goldens.json (made by tests/support/make_template_goldens.py).
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
from pathlib import Path

import pytest

from llmd.prompt import jinja
from llmd.prompt.jinja import values as jinja_values
from llmd.prompt.jinja import Template, TemplateError, TemplateRaised, TemplateRuntimeError, TemplateSyntaxError
from tests.reference_data import require
from tests.support.template_cases import CONVERSATIONS, NOW, variables

GOLDENS = json.loads((Path(__file__).parents[1] / "data" / "template_goldens.json").read_text("utf-8"))


def render(source: str, **values) -> str:
    return Template(source).render(values, clock=lambda: NOW)


# (name, template, variables, expected Jinja2 output)
RENDERINGS = [
    ("text_passes_through", "Hello", {}, "Hello"),
    ("one_trailing_newline_dropped", "a\n\n", {}, "a\n"),
    ("crlf_normalised", "a\r\nb{{ 'x\r\ny' }}", {}, "a\nbx\ny"),
    ("trim_blocks_eats_newline_after_tag", "{% if true %}\nyes\n{% endif %}\nend", {}, "yes\nend"),
    ("lstrip_blocks_strips_indent_before_tag", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}, "a\n    b\nc"),
    ("lstrip_blocks_not_for_expressions", "a\n   {{ 'x' }}", {}, "a\n   x"),
    ("lstrip_blocks_not_after_text_on_line", "a  {% if true %}b{% endif %}", {}, "a  b"),
    ("plus_keeps_indent", "a\n  {%+ if true %}b{% endif %}", {}, "a\n  b"),
    ("minus_strips_both_sides", "a  \n {%- if true -%}  \n b {%- endif %}", {}, "ab"),
    ("expression_minus", "x  {{- 'y' -}}  z", {}, "xyz"),
    ("comment_removed_and_trimmed", "a\n  {# note #}\nb", {}, "a\nb"),
    ("comment_minus", "a  {#- note -#}  b", {}, "ab"),
    ("string_escapes", "{{ 'a\\nb\\t\\u00e9\\\\' }}|{{ \"it's\" }}", {}, "a\nb\té\\|it's"),
    ("adjacent_strings_concatenate", "{{ 'a' 'b' }}", {}, "ab"),
    ("python_reprs", "{{ [1, 'a', none, true] }} {{ {'k': 1.5} }} {{ none }} {{ 2.0 }}", {},
     "[1, 'a', None, True] {'k': 1.5} None 2.0"),
    ("arithmetic", "{{ 7 // 2 }} {{ 7 / 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -3 + 1 }} {{ 'ab' * 2 }}", {},
     "3 3.5 1 1024 -2 abab"),
    ("tilde_converts", "{{ 1 ~ 'a' ~ none ~ undefined_name }}", {}, "1aNone"),
    ("ternary_and_missing_else", "{{ 'y' if x else 'n' }}[{{ 'y' if not x }}]", {"x": 0}, "n[y]"),
    ("comparison_chain_and_in", "{{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 2 not in [1] }} {{ 'k' in {'k': 1} }}", {},
     "True True True True"),
    ("and_or_return_operands", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }}", {}, "x b []"),
    ("slicing", "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3][-1] }} {{ xs[1:] }}", {"xs": [1, 2, 3]},
     "el olleh 3 [2, 3]"),
    ("attribute_falls_back_to_item", "{{ m.role }} {{ m['role'] }} {{ m.missing }}|", {"m": {"role": "user"}},
     "user user |"),
    ("dict_method_wins_over_key", "{{ d.items is defined }} {{ d['items'] }}", {"d": {"items": 3}}, "True 3"),
    ("integer_attribute_is_index", "{{ xs.0 }}", {"xs": ["a"]}, "a"),
    ("string_methods", "{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"
     "|{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aXa'.replace('a', 'b') }}"
     "|{{ 'a b'.title() }}|{{ 'x'.join(['1', '2']) }}|{{ '{}-{}'.format(1, 2) }}|{{ 'a\\nb'.splitlines() }}"
     "|{{ '  x'.lstrip() }}{{ 'x  '.rstrip() }}|{{ 'a b  c'.split() }}|{{ 'a-b-c'.rsplit('-', 1) }}", {},
     "a b|['a', 'b']|ABab|TrueTrue|bXb|A B|1x2|1-2|['a', 'b']|xx|['a', 'b', 'c']|['a-b', 'c']"),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('a') }}{{ d.get('z', 0) }}"
     "{{ d.keys() | list }}{{ d.values() | list }}", {"d": {"a": 1, "b": 2}}, "a=1;b=2;10['a', 'b'][1, 2]"),
    ("for_loop_fields", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }},{% endfor %}", {},
     "1032TrueFalse3,2121FalseFalse3,3210FalseTrue3,"),
    ("loop_prev_next_and_cycle", "{% for x in [1,2,3] %}{{ loop.previtem }}{{ loop.nextitem }}"
     "{{ loop.cycle('a', 'b') }} {% endfor %}", {}, "2a 13b 2a "),
    ("for_else_and_filter", "{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% else %}none"
     "{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}", {}, "2242empty"),
    ("for_over_dict_and_unpacking", "{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"
     "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}, "ab37"),
    ("break_and_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
     "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}, "013"),
    ("loop_body_scope_resets_each_iteration",
     "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i + 10 %}{{ x }},{% endfor %}{{ x }}", {},
     "010,011,012,0"),
    ("if_does_not_scope", "{% if true %}{% set q = 1 %}{% endif %}{{ q }}", {}, "1"),
    ("namespace_carries_out_of_loops", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}"
     "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}, "6"),
    ("block_set_and_filter", "{% set x %}  a {{ 1 }} {% endset %}[{{ x }}]{% set y | trim | upper %} b "
     "{% endset %}[{{ y }}]", {}, "[  a 1 ][B]"),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}, "12"),
    ("macro_defaults_and_kwargs", "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
     "{{ m(1) }}|{{ m(1, c=3) }}|{{ m(b=2, a=0) }}", {}, "1BNone|1B3|02None"),
    ("macro_sees_later_top_level_names",
     "{% set y = 4 %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}", {}, "5"),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, z=3) }}",
     {}, "1(2,){'z': 3}"),
    ("call_block_with_caller", "{% macro box(t) %}[{{ t }}:{{ caller() }}]{% endmacro %}"
     "{% call box('x') %}inner{% endcall %}", {}, "[x:inner]"),
    ("call_block_with_arguments", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
     "{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}", {}, "<1><2>"),
    ("filter_block", "{% filter upper %}abc{% endfilter %}", {}, "ABC"),
    ("raw_block_is_text", "a\n  {% raw %}{{ x }}{% if %}\n{%- endraw %}\nb", {}, "a\n{{ x }}{% if %}b"),
    ("with_block_scopes_its_names", "{% with y = 2, z = x %}{{ y ~ z }}{% endwith %}[{{ y }}]", {"x": 1}, "21[]"),
    ("generation_block_is_transparent", "{% generation %}ab{% endgeneration %}", {}, "ab"),
    ("tojson_like_transformers", "{{ {'a': 'é<', 'b': [1, none, true]} | tojson }}|{{ 'x' | tojson(indent=2) }}"
     "|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ [1, 2] | tojson(separators=(',', ':')) }}"
     "|{{ 'é' | tojson(ensure_ascii=true) }}|{{ {'k': [1]} | tojson(indent=2) }}", {},
     '{"a": "é<", "b": [1, null, true]}|"x"|{"a": 2, "b": 1}|[1,2]|"\\u00e9"|{\n  "k": [\n    1\n  ]\n}'),
    ("common_filters", "{{ ' x ' | trim }}|{{ 'abc' | length }}|{{ [3, 1, 2] | sort | join(',') }}"
     "|{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ 'aBc' | capitalize }}|{{ 'a-b c' | title }}"
     "|{{ x | default('d') }}{{ '' | default('e', true) }}|{{ '3.7' | int }}{{ 'z' | int(5) }}{{ 2.567 | round(1) }}"
     "|{{ [1, 1, 2] | unique | list }}|{{ 'abc' | list }}|{{ 5 | string ~ 'x' }}|{{ 'ab' | replace('a', 'c') }}"
     "|{{ [1, 2] | reverse | list }}|{{ 'x' | upper }}{{ 'X' | lower }}|{{ -2 | abs }}|{{ [1, 2] | sum }}"
     "|{{ [3, 1] | min }}{{ [3, 1] | max }}|{{ {'b': 1, 'a': 2} | dictsort }}|{{ 'a\\nb' | indent(2) }}"
     "|{{ {'a': 1} | items | list }}|{{ 'ab' | center(6) }}|{{ '%s-%s' | format(1, 2) }}|{{ 'x<' | e }}", {},
     "x|3|1,2,3|12|Abc|A-B C|de|352.6|[1, 2]|['a', 'b', 'c']|5x|cb|[2, 1]|Xx|2|3|13"
     "|[('a', 2), ('b', 1)]|a\n  b|[('a', 1)]|  ab  |1-2|x&lt;"),
    ("select_reject_map", "{{ xs | selectattr('role', 'equalto', 'user') | map(attribute='c') | join }}"
     "|{{ xs | rejectattr('role', 'eq', 'user') | list | length }}|{{ [1, 2, 3] | select('odd') | list }}"
     "|{{ [1, none] | reject('none') | list }}|{{ ['a'] | map('upper') | list }}"
     "|{{ xs | selectattr('c') | list | length }}|{{ none | selectattr('x') | list }}",
     {"xs": [{"role": "user", "c": "a"}, {"role": "bot", "c": ""}, {"role": "user", "c": "b"}]},
     "ab|1|[1, 3]|[1]|['A']|2|[]"),
    ("tests", "{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
     "{{ 'a' is sequence }}{{ 1 is number }}{{ true is number }}{{ true is boolean }}{{ 1 is integer }}"
     "{{ 1.0 is float }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 'a' is lower }}{{ x is undefined }}"
     "{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 1 is in [1] }}{{ 2 is not in [1] }}", {},
     "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"),
    ("strftime_now_reads_the_clock", "{{ strftime_now('%d %b %Y') }}", {}, "15 Jan 2026"),
    ("markup_plus_escapes_plain_strings", "{{ 'a'|safe + '<b>' }}|{{ '<' ~ ('<'|safe) }}|{{ 'x' + 'y' }}", {},
     "a&lt;b&gt;|<<|xy"),
    ("undefined_is_empty_and_false", "[{{ nope }}]{{ nope | length }}{% for x in nope %}x{% endfor %}"
     "{{ not nope }}{{ nope == nope }}{{ d.nope is defined }}", {"d": {}}, "[]0TrueTrueFalse"),
    ("unsafe_attribute_prints_nothing", "[{{ x.__class__ }}{{ xs.append is defined }}]", {"x": "s", "xs": []},
     "[False]"),
    ("out_of_range_index_is_undefined", "[{{ 'ab'[5] }}{{ [1][3] }}]", {}, "[]"),
    ("dict_literal_and_list_concat", "{{ ({'a': 1} | items | list) + [[2, 3]] }}", {}, "[('a', 1), [2, 3]]"),
]


@pytest.mark.parametrize("name, source, values, expected", RENDERINGS, ids=[r[0] for r in RENDERINGS])
def test_rendering_matches_jinja2(name, source, values, expected):
    assert render(source, **copy.deepcopy(values)) == expected


# (name, template, variables, message fragment) -- each is an error in Jinja2 too.
ERRORS = [
    ("undefined_attribute", "{{ x.y }}", {}, "'x' is undefined"),
    ("mutating_method_is_unsafe", "{{ xs.append(1) }}", {"xs": []}, "access to attribute 'append' of 'list'"),
    ("dunder_is_unsafe", "{{ x.__class__.__name__ }}", {"x": "s"}, "access to attribute '__class__'"),
    ("pop_on_dict_is_unsafe", "{{ d.pop('a') }}", {"d": {"a": 1}}, "'pop' of 'dict'"),
    ("str_plus_int", "{{ 'a' + 1 }}", {}, "TypeError"),
    ("raise_exception", "{{ raise_exception('no system role') }}", {}, "no system role"),
    ("unknown_filter", "{{ 'x' | from_json }}", {}, "filter 'from_json' is not supported"),
    ("unknown_test", "{{ 1 is prime }}", {}, "test 'prime' is not supported"),
    ("tojson_of_generator", "{{ [1] | map('string') | tojson }}", {}, "not JSON serializable"),
    ("length_of_generator", "{{ [1] | select | length }}", {}, "generator"),
    ("iterate_none", "{% for x in none %}{% endfor %}", {}, "'NoneType' object is not iterable"),
    ("call_a_string", "{{ 'a'() }}", {}, "not callable"),
    ("compare_str_int", "{{ 'a' < 1 }}", {}, "'<' not supported"),
    ("set_attribute_of_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}, "namespace"),
    ("macro_too_many_arguments", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}, "takes not more than 1"),
]


@pytest.mark.parametrize("name, source, values, fragment", ERRORS, ids=[e[0] for e in ERRORS])
def test_jinja2_errors_are_errors_here_too(name, source, values, fragment):
    with pytest.raises(TemplateRuntimeError, match=None) as info:
        render(source, **values)
    assert fragment in str(info.value)


@pytest.mark.parametrize("source, fragment, line", [
    ("a\n{% include 'x' %}", "the tag {% include %} is not supported", 2),
    ("{% for x in y %}", "missing {% endfor %}", 1),
    ("{{ 1 + }}", "expected an expression", 1),
    ("\n\n{{ 'a' ", "tag is not closed", 3),
    ("{% if x %}{% endfor %}", "the tag {% endfor %} is not supported", 1),
    ("{{ a $ b }}", "unexpected character '$'", 1),
    ("{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported", 1),
])
def test_syntax_errors_name_the_construct_and_line(source, fragment, line):
    with pytest.raises(TemplateSyntaxError) as info:
        Template(source)
    assert fragment in str(info.value)
    assert info.value.line == line
    assert f"(template line {line})" in str(info.value)


def test_runtime_errors_carry_the_line():
    with pytest.raises(TemplateRuntimeError) as info:
        render("a\nb\n{{ x.y }}")
    assert info.value.line == 3


def test_raise_exception_is_its_own_error_with_the_templates_message():
    with pytest.raises(TemplateRaised, match="Conversation roles must alternate"):
        render("{{ raise_exception('Conversation roles must alternate') }}")


def test_output_size_is_bounded(monkeypatch):
    monkeypatch.setattr(jinja_values, "MAX_OUTPUT", 1000)
    with pytest.raises(TemplateRuntimeError, match="longer than 1000"):
        render("{% for i in range(100) %}0123456789ab{% endfor %}")
    with pytest.raises(TemplateRuntimeError, match="output limit"):
        render("{{ 'ab' * 600 }}")


def test_loop_iterations_are_bounded(monkeypatch):
    monkeypatch.setattr(jinja_values, "MAX_ITERATIONS", 50)
    with pytest.raises(TemplateRuntimeError, match="more than 50 loop iterations"):
        render("{% for i in range(10) %}{% for j in range(10) %}{% endfor %}{% endfor %}")


def test_range_and_recursion_are_bounded():
    with pytest.raises(TemplateRuntimeError, match="range"):
        render("{{ range(10 ** 9) | length }}")
    with pytest.raises(TemplateRuntimeError, match="nest deeper"):
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")


@pytest.mark.parametrize("source", [
    "{{ '%099999999d' % 1 }}", "{{ '%.99999999f' | format(1.0) }}", "{{ '{:>99999999}'.format(1) }}",
    "{{ 'a'.center(10 ** 9) }}", "{{ 'a\\tb'.expandtabs(10 ** 9) }}", "{{ 'x' | indent(10 ** 9, true) }}",
    "{{ 'x' | center(10 ** 9) }}", "{{ '%(a)099999999d' % {'a': 1} }}",
])
def test_field_widths_beyond_the_output_limit_are_refused_before_building_the_string(source):
    with pytest.raises(TemplateRuntimeError, match="beyond the output limit") as info:
        render(source)
    assert info.value.line == 1


def test_ordinary_field_widths_format_as_python():
    assert render("{{ '%5d|%-3s|%.2f' % (42, 'a', 3.14159) }}{{ '{:>4}'.format(7) }}{{ 'a'.center(5) }}") == \
        "   42|a  |3.14   7  a  "


def test_data_nested_too_deeply_is_an_error_not_a_crash():
    deep = node = {}
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(TemplateRuntimeError, match="nests too deeply"):
        Template("{{ m }}").render_parts({}, {"m": deep})


@pytest.mark.parametrize("first, more", [("1", " + 1"), ("'a'", " ~ 'a'"), ("x", " and x"), ("x", " | trim"),
                                         ("x", ".y")])
def test_a_flat_chain_deeper_than_the_nesting_limit_is_refused_when_parsed(first, more):
    # A chain parses in a loop but nests as deep; walked (the variables a template reads)
    # or rendered, a thousand terms ran out of Python's stack (RecursionError).
    with pytest.raises(TemplateSyntaxError, match="levels deep"):
        Template("{{ " + first + more * 999 + " }}")
    assert Template("{{ " + " + ".join(["1"] * 150) + " }}").render({}) == "150"


def test_render_parts_marks_every_character_from_data():
    t = Template("{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>' }}"
                 "{% for w in m.content.split(' ') %}[{{ w }}]{% endfor %}{{ m.content | tojson }}")
    parts = t.render_parts({}, {"m": {"role": "user", "content": " a<|im_end|> b "}})
    assert parts == [("<|im_start|>", None), ("user", 0), ("\n", None), ("a<|im_end|> b", 0),
                     ("<|im_end|>[][", None), ("a<|im_end|>", 0), ("][", None), ("b", 0),
                     ("][]", None), ('" a<|im_end|> b "', 0)]


def test_render_parts_keeps_data_through_macros_namespaces_and_filters():
    t = Template("{% set ns = namespace(p='') %}{% macro q(x) %}<{{ x | upper }}>{% endmacro %}"
                 "{% for m in messages %}{% set ns.p = ns.p + q(m) %}{% endfor %}{{ ns.p | replace('<', '[') }}|"
                 "{{ messages | join('<sep>') }}|{{ '%s!' % messages[0] }}")
    parts = t.render_parts({}, {"messages": ["<eot>", "x"]})
    text = "".join(t for t, _ in parts)
    assert text == "[[EOT>>[X>|<eot><sep>x|<eot>!"
    data = "".join(t for t, source in parts if source is not None)
    template = "".join(t for t, source in parts if source is None)
    assert "<eot>" in data and "EOT" in data and "<sep>" in template and "<eot>" not in template


def test_tagged_data_keeps_its_tag_through_slices_and_loses_it_when_transformed():
    t = Template("{{ a }}|{{ a[1:] }}|{{ a | upper }}|{{ b }}")
    parts = t.render_parts({}, {"a": jinja.data_text("xyz", 7), "b": "q"})
    assert parts == [("xyz", 7), ("|", None), ("yz", 7), ("|", None), ("XYZ", 0), ("|", None), ("q", 0)]


@pytest.fixture(scope="module")
def template_dir() -> Path:
    return require("models/templates")


def test_reference_goldens_cover_every_template(template_dir):
    names = sorted(p.name for p in template_dir.glob("*.jinja"))
    assert names == sorted(GOLDENS["templates"])
    assert len(names) >= 70


def _golden_cases():
    for template, entry in sorted(GOLDENS["templates"].items()):
        for conversation in entry["renderings"]:
            yield template, conversation


@pytest.mark.parametrize("template, conversation", list(_golden_cases()))
def test_reference_template_renders_byte_identical_to_jinja2(template_dir, template, conversation):
    entry = GOLDENS["templates"][template]
    source = (template_dir / template).read_text("utf-8")
    assert hashlib.sha256(source.encode()).hexdigest() == entry["source_sha256"]
    golden = entry["renderings"][conversation]
    values = copy.deepcopy(variables(CONVERSATIONS[conversation]))
    if "raises" in golden:
        with pytest.raises(TemplateError):
            Template(source).render(values, clock=lambda: NOW)
        return
    text = Template(source).render(values, clock=lambda: NOW)
    assert (len(text), hashlib.sha256(text.encode()).hexdigest()) == (golden["length"], golden["sha256"])


def test_reference_renderings_with_data_marked_are_the_same_text(template_dir):
    """Provenance tracking never changes what is rendered."""
    checked = 0
    for template, conversation in _golden_cases():
        golden = GOLDENS["templates"][template]["renderings"][conversation]
        if "raises" in golden:
            continue
        values = copy.deepcopy(variables(CONVERSATIONS[conversation]))
        data = {k: values.pop(k) for k in ("messages", "tools")}
        parts = Template((template_dir / template).read_text("utf-8")).render_parts(
            values, data, clock=lambda: NOW)
        text = "".join(t for t, _ in parts)
        assert hashlib.sha256(text.encode()).hexdigest() == golden["sha256"], (template, conversation)
        checked += 1
    assert checked > 700


def test_clock_defaults_to_now():
    before = datetime.datetime.now().year
    year = Template("{{ strftime_now('%Y') }}").render({})
    assert int(year) in (before, datetime.datetime.now().year)  # the year may turn meanwhile
