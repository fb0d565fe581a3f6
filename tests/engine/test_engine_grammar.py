"""Constrained decoding in the engine (native/src/decode/grammar.cpp through llmd.engine.native), on the
tiny random model: whatever the weights say, output follows the grammar; the fast paths
(trie walk, greedy favourites first) agree with their references."""
from __future__ import annotations

import json

import pytest

from llmd.engine.native import Engine, EngineError, Sampling
from llmd.structured.grammar import compile_grammar
from llmd.structured.jsonschema import SchemaCompiler
from tests.support.schema_validator import errors

PROMPT = [72, 101, 108, 108, 111]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "age"], "additionalProperties": False}


def schema_grammar(schema) -> str:
    rules = {}
    rules["root"] = SchemaCompiler(rules, "s:").compile_root(schema)
    return compile_grammar(rules, "root")


def object_grammar() -> str:
    rules = {}
    rules["root"] = SchemaCompiler(rules, "s:").any_object()
    return compile_grammar(rules, "root")


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model.path, n_threads=2, max_sessions=4) as e:
        yield e


def generate(engine, grammar, sampling=Sampling(), budget=0, limit=200, check=None):
    """(output bytes, tokens) of a constrained generation; check(session) runs before each step."""
    with engine.new_session() as s:
        s.set_sampling(sampling)
        s.set_grammar(grammar, budget)
        s.prefill(PROMPT)
        out, tokens = b"", []
        for _ in range(limit):
            if check:
                check(s)
            tok = s.decode_one()
            out += tok.piece
            tokens.append(tok)
            if tok.is_terminal:
                break
        return out, tokens


def test_output_follows_the_schema_and_the_completing_token_is_terminal(engine):
    for seed in range(4):
        out, tokens = generate(engine, schema_grammar(PERSON), Sampling(temperature=1.0, seed=seed), budget=120)
        assert tokens[-1].is_terminal and not tokens[-1].is_eos  # the grammar ended it, not EOS
        value = json.loads(out)
        assert errors(value, PERSON) == [], out
        assert len(tokens) <= 120


def test_the_budget_closes_the_output_in_time_and_says_so(engine):
    out, tokens = generate(engine, object_grammar(), Sampling(temperature=1.5, seed=3), budget=16)
    assert len(tokens) <= 16 and tokens[-1].is_terminal
    assert isinstance(json.loads(out), dict)
    assert any(t.forced for t in tokens)


def test_fast_mask_equals_the_per_token_reference_at_every_step(engine):
    compared = []

    def same_masks(s):
        fast = s.grammar_mask(fast=True)
        assert fast == s.grammar_mask(fast=False)
        compared.append(sum(1 for b in fast if b))

    generate(engine, schema_grammar(PERSON), Sampling(temperature=1.0, seed=7), budget=60, check=same_masks)
    assert len(compared) > 5 and max(compared) > 100 and min(compared) < 10  # strings and structure


def test_masks_mark_tokens_over_the_budget(engine, tiny_model):
    with engine.new_session() as s:
        s.set_grammar(schema_grammar({"type": "string"}), 2)
        s.prefill(PROMPT)
        mask = s.grammar_mask()
        quote = engine.tokenize('"')[0]
        assert mask[quote] == 2          # '"' then '"' fits two tokens
        assert mask[engine.tokenize("a")[0]] == 0  # a string starts with a quote
        assert mask[tiny_model.eos_id] == 0       # nothing to end yet
        s.set_grammar(schema_grammar({"type": "string"}), 1)
        assert s.grammar_mask()[quote] == 1       # allowed, but leaves no room to close


def test_greedy_favourites_first_picks_what_the_full_mask_would(engine):
    grammar = schema_grammar(PERSON)
    greedy, _ = generate(engine, grammar, Sampling(temperature=0.0), budget=80)
    masked, _ = generate(engine, grammar, Sampling(temperature=1.0, top_k=1), budget=80)
    assert greedy == masked
    json.loads(greedy)


def test_end_of_generation_is_allowed_only_where_the_grammar_may_end(engine, tiny_model):
    with engine.new_session() as s:
        s.set_grammar(schema_grammar({"type": "integer"}))
        s.prefill(PROMPT)
        assert s.grammar_mask()[tiny_model.eos_id] == 0
        seven = engine.tokenize("7")
        s.set_sampling(Sampling(logit_bias={t: -100.0 for t in range(tiny_model.n_vocab) if t not in seven}))
        tok = s.decode_one()
        assert tok.piece == b"7" and not tok.is_terminal  # "7" may go on: "71"
        assert s.grammar_mask()[tiny_model.eos_id] == 2


def test_logit_bias_cannot_push_output_outside_the_grammar(engine):
    ban = {t: -100.0 for t in engine.tokenize('{"')}
    out, _ = generate(engine, object_grammar(), Sampling(logit_bias=ban), budget=30)
    assert isinstance(json.loads(out), dict)


def test_set_grammar_refuses_malformed_text_and_none_removes_the_constraint(engine):
    with engine.new_session() as s:
        with pytest.raises(EngineError, match="grammar: the header"):
            s.set_grammar("not a grammar")
        with pytest.raises(EngineError, match="no grammar"):
            s.grammar_mask()
        s.set_grammar(object_grammar())
        assert s.grammar_mask() is not None
        s.set_grammar(None)
        with pytest.raises(EngineError, match="no grammar"):
            s.grammar_mask()
        with pytest.raises(EngineError):
            s.set_grammar(object_grammar(), -1)


def test_a_control_token_terminal_allows_exactly_that_token_and_is_written(engine, tiny_model):
    """A token edge: the control token <|im_start|> (no bytes) is allowed where the
    grammar names it and nowhere else, counts as one token of the budget, and the fast
    mask (trie walk plus token edges) equals the per-token reference."""
    from llmd.structured.grammar import lit, seq, token
    (control,) = engine.tokenize("<|im_start|>", special=True)
    (other,) = engine.tokenize("<|im_end|>", special=True)
    grammar = compile_grammar({"root": seq(lit("A"), token(control), lit("B"))}, "root")
    with engine.new_session() as s:
        s.set_grammar(grammar, 3)
        s.prefill(PROMPT)
        assert s.grammar_mask()[control] == 0 and s.grammar_mask()[engine.tokenize("A")[0]] == 2
        s.set_sampling(Sampling(logit_bias={engine.tokenize("A")[0]: 100.0}))
        assert s.decode_one().piece == b"A"
        fast = s.grammar_mask(fast=True)
        assert fast == s.grammar_mask(fast=False)
        assert [i for i, b in enumerate(fast) if b] == [control] and fast[control] == 2  # "B" still fits
        s.set_sampling(Sampling(logit_bias={other: 100.0}))  # the grammar wins over the bias
        tok = s.decode_one()
        assert tok.id == control and tok.piece == b"" and not tok.is_terminal
        assert [i for i, b in enumerate(s.grammar_mask()) if b] == engine.tokenize("B")
        tok = s.decode_one()
        assert tok.piece == b"B" and tok.is_terminal


def test_a_token_edge_must_name_a_control_token_that_is_not_end_of_generation(engine, tiny_model):
    from llmd.structured.grammar import seq, lit, token
    text_token = engine.tokenize("A")[0]
    with engine.new_session() as s:
        for bad in (text_token, tiny_model.eos_id, tiny_model.n_vocab):
            with pytest.raises(EngineError, match=f"token {bad} is not a control token"):
                s.set_grammar(compile_grammar({"root": seq(lit("x"), token(bad))}, "root"))
