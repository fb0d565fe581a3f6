"""llmd/structured/grammar.py compiled and run by the native matcher (llmd_grammar_match), and the
native parser's refusal of malformed and hostile automaton texts."""
import random

import pytest

from llmd.engine.native import EngineError, grammar_match
from llmd.structured import grammar
from llmd.structured.grammar import (
    EMPTY, GrammarError, GrammarTooLarge, Ref, alt, byte_range, compile_grammar, lit, one_of, opt,
    repeat, seq, star, text_without, token,
)

NO, PREFIX, MAY_END, COMPLETE = 0, 1, 2, 3


def matcher(rules, root="root"):
    text = compile_grammar(rules, root)
    return lambda data: grammar_match(text, data.encode() if isinstance(data, str) else data)


def test_literals_classes_and_repeats_report_prefix_and_end():
    match = matcher({"root": seq(lit("ab"), star(one_of("xy")), opt(lit("!")))})
    assert [match(t) for t in ["", "a", "ab", "abxyx", "abx!", "abz", "b"]] == [
        PREFIX, PREFIX, MAY_END, MAY_END, COMPLETE, NO, NO]


def test_bounded_repeat_allows_between_min_and_max_copies():
    match = matcher({"root": repeat(lit("ab"), 2, 3)})
    assert [match("ab" * n) for n in range(5)] == [PREFIX, PREFIX, MAY_END, COMPLETE, NO]


def test_recursive_rule_matches_nested_brackets_to_any_depth_within_the_stack():
    match = matcher({"root": seq(lit("("), opt(Ref("root")), lit(")"))})
    assert match("((()))") == COMPLETE
    assert match("((())") == PREFIX
    assert match("(()))") == NO
    assert match("(" * 1000 + ")" * 1000) == COMPLETE
    assert match("(" * 1100) == NO  # deeper than the engine's stack limit: refused, not a crash


def test_right_recursion_does_not_grow_the_stack():
    # A tail call needs no frame: 5000 items would overflow the depth limit otherwise.
    match = matcher({"root": seq(lit("a"), opt(Ref("root")))})
    assert match("a" * 5000) == MAY_END


def test_alternatives_sharing_a_prefix_are_followed_together():
    match = matcher({"root": alt(seq(lit("ab"), Ref("x")), seq(lit("ab"), Ref("y"))),
                     "x": lit("cd"), "y": lit("ce")})
    assert (match("abc"), match("abcd"), match("abce"), match("abcf")) == (PREFIX, COMPLETE, COMPLETE, NO)


def test_byte_range_and_class_arithmetic():
    digits = byte_range(0x30, 0x39)
    match = matcher({"root": star(digits - one_of("5") | one_of("x"))})
    assert (match("0123x"), match("15")) == (MAY_END, NO)


def test_random_strings_agree_with_a_python_regex():
    import re
    match = matcher({"root": seq(star(alt(lit("ab"), lit("c"))), repeat(one_of("de"), 1, 2))})
    pattern = re.compile(r"(ab|c)*[de]{1,2}")
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice("abcde") for _ in range(rng.randint(0, 8)))
        assert (match(text) >= MAY_END) == bool(pattern.fullmatch(text)), text


@pytest.mark.parametrize("markers", [("<tool_call>",), ("</parameter>", "</tool_call>"), ('<|"|>', "<tool_call|>")])
def test_text_without_markers_is_exactly_the_texts_that_contain_none(markers):
    match = matcher({"root": text_without(markers)})
    rng = random.Random(11)
    fragments = ["<", "|", "/", '"', "tool", "_call", ">", "para", "meter", "x", "\n",
                 *markers, *(m[:-1] for m in markers)]
    for _ in range(400):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(0, 6)))
        assert (match(text) >= MAY_END) == (not any(m in text for m in markers)), text


def test_text_without_markers_over_characters_takes_wide_units_and_no_stray_bytes():
    wide = seq(byte_range(0xC2, 0xDF), byte_range(0x80, 0xBF))
    match = matcher({"root": text_without(["</p>"], byte_range(0x20, 0x7E), wide)})
    assert [match(t) for t in ["a</b>é<", "é</p>", "a\n", "<é/p>", "</pé"]] == [MAY_END, NO, NO, MAY_END, MAY_END]
    assert match(b"a\xc3") == PREFIX and match(b"\x80") == NO


def test_states_with_the_same_future_are_merged():
    # "a" and "b" both lead to "x": start, after either letter, accepted: three states.
    text = compile_grammar({"root": alt(seq(lit("a"), lit("x")), seq(lit("b"), lit("x")))}, "root")
    assert text.splitlines()[0] == "llmd-grammar 1 3 0"
    assert [grammar_match(text, t) for t in (b"ax", b"bx", b"x")] == [COMPLETE, COMPLETE, NO]


def test_left_recursion_and_undefined_rules_are_refused_by_the_compiler():
    with pytest.raises(GrammarError, match="left-recursive"):
        compile_grammar({"root": alt(seq(Ref("root"), lit("a")), lit("b"))}, "root")
    with pytest.raises(GrammarError, match="left-recursive"):  # through a nullable prefix
        compile_grammar({"root": seq(opt(lit("x")), Ref("b")), "b": seq(EMPTY, Ref("root"))}, "root")
    with pytest.raises(GrammarError, match="undefined"):
        compile_grammar({"root": Ref("nope")}, "root")


def test_a_grammar_without_a_finite_text_is_refused_by_the_compiler():
    # the engine would refuse it too ("accepts nothing"), after the request was admitted
    with pytest.raises(GrammarError, match="no finite text"):
        compile_grammar({"root": seq(lit("["), Ref("root"), lit("]"))}, "root")
    with pytest.raises(GrammarError, match="no finite text"):  # through another rule and a repeat
        compile_grammar({"root": seq(lit("a"), Ref("b")), "b": repeat(Ref("root"), 1, None)}, "root")
    with pytest.raises(GrammarError, match="no finite text"):
        compile_grammar({"root": alt()}, "root")
    # a way out is enough, through any branch or an optional repeat
    compile_grammar({"root": alt(seq(lit("["), Ref("root"), lit("]")), lit("x"))}, "root")
    compile_grammar({"root": seq(lit("["), star(Ref("root")), lit("]"))}, "root")


def test_size_limit_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(grammar, "MAX_STATES", 100)
    with pytest.raises(GrammarTooLarge):
        compile_grammar({"root": repeat(lit("a"), 0, 500)}, "root")


def test_bad_repeat_bounds_are_refused():
    with pytest.raises(ValueError):
        repeat(lit("a"), 3, 2)


# --- the native parser ---------------------------------------------------------------

@pytest.mark.parametrize("text, reason", [
    ("", "header"),
    ("llmd-grammar 2 1 0\n$\n", "header"),
    ("llmd-grammar 1 0 0\n", "state count"),
    ("llmd-grammar 1 99999999999 0\n", "header"),
    ("llmd-grammar 1 2000000 0\n", "state count"),
    ("llmd-grammar 1 1 1\n$\n", "start state"),
    ("llmd-grammar 1 2 0\n61>5\n$\n", "out of range"),
    ("llmd-grammar 1 2 0\n61-7a>1 70>1\n$\n", "overlap"),
    ("llmd-grammar 1 2 0\n7a-61>1\n$\n", "empty"),
    ("llmd-grammar 1 2 0\n@1>7\n$\n", "out of range"),
    ("llmd-grammar 1 2 0\n61>1  62>1\n$\n", "unexpected"),
    ("llmd-grammar 1 2 0\n61>1\t62>1\n$\n", "one space"),
    ("llmd-grammar 1 2 0\nzz>1\n$\n", "unexpected"),
    ("llmd-grammar 1 2 0\n61\n$\n", "lacks"),
    ("llmd-grammar 1 3 0\n61>1\n$\n", "fewer"),
    ("llmd-grammar 1 1 0\n$\n$\n", "more"),
    ("llmd-grammar 1 2 0\n61>0\n$\n", "accepts nothing"),
    ("llmd-grammar 1 2 0\n@0>1\n$\n", "accepts nothing"),
    ("llmd-grammar 1 2 0\n61>1 @0>1\n$\n", "left recursion"),
    ("llmd-grammar 1 3 0\n@1>2\n@0>2 $\n$\n", "left recursion"),
    ("llmd-grammar 1 2 0\nt5>7\n$\n", "out of range"),
    ("llmd-grammar 1 2 0\nt3000000000>1\n$\n", "out of range"),
    ("llmd-grammar 1 2 0\nt5\n$\n", "tID>T"),
    ("llmd-grammar 1 2 0\ntx>1\n$\n", "tID>T"),
    ("llmd-grammar 1 3 0\nt5>1 t5>2\n$\n$\n", "two edges"),
])
def test_malformed_or_hostile_automata_are_refused_with_a_reason(text, reason):
    with pytest.raises(EngineError, match=reason):
        grammar_match(text, b"a")


def test_a_control_token_compiles_to_a_token_edge_no_bytes_can_take():
    """token(id) is its own symbol: bytes alone never pass it (the spelling of the
    token's text included), while the automaton around it still reads bytes."""
    text = compile_grammar({"root": seq(lit("a"), alt(token(7), lit("b")), star(token(300000)))}, "root")
    assert " t7>" in text and " t300000>" in text
    assert grammar_match(text, b"a") == PREFIX
    assert grammar_match(text, b"ab") == MAY_END
    assert grammar_match(text, b"a<7>") == NO
    with pytest.raises(ValueError):
        token(-1)


def test_garbage_bytes_are_refused():
    rng = random.Random(3)
    for _ in range(50):
        data = "llmd-grammar 1 3 0\n" + "".join(chr(rng.randint(0, 127)) for _ in range(rng.randint(0, 40)))
        try:
            grammar_match(data, b"abc")
        except EngineError:
            pass  # refused with a message; the point is no crash


def test_too_ambiguous_grammar_fails_the_step_instead_of_exploding():
    # State 1 calls state 0 with two return states: every "a" doubles the parses.
    text = "llmd-grammar 1 5 0\n61>1\n@0>2 @0>3 $\n62>4\n63>4\n$\n"
    assert grammar_match(text, b"aab") == COMPLETE
    with pytest.raises(EngineError, match="ambiguous"):
        grammar_match(text, b"a" * 12)
