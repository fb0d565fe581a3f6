"""A rendered chat prompt as token ids (llmd.prompt.templates.tokenize_prompt over
Engine.tokenize_marked): the whole prompt in one tokenizer call, as llama.cpp
tokenizes it with special tokens parsed, except that control tokens match only in
the template's own markers.

Goldens: tests/data/prompt_goldens.json, written by tests/data/gen_prompt_goldens.py
from Jinja2 renderings and llama.cpp's llama_tokenize (parse_special on, no BOS).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmd.api.routes import PromptIds
from llmd.engine.native import Engine
from llmd.prompt import templates
from llmd.serving.sessions import MAX_REPLIES, Slot
from tests.support.gguf_writer import ARRAY, F32, I32, STRING, build_spm_vocab
from tests.reference_data import require

GOLDENS = json.loads((Path(__file__).parents[1] / "data" / "prompt_goldens.json").read_text("utf-8"))

_engines: dict[str, Engine] = {}


def engine(vocab: str) -> Engine:
    if vocab not in _engines:
        _engines[vocab] = Engine(str(require(f"models/ggml-vocab-{vocab}.gguf")))
    return _engines[vocab]


def teardown_module() -> None:
    for e in _engines.values():
        e.close()
    _engines.clear()


def template_of(case: dict, e: Engine, tmp_path: Path) -> templates.JinjaTemplate | templates.ChatTemplate:
    if case["template"] is None:
        path = tmp_path / "llama2.jinja"
        path.write_text(GOLDENS["llama2_template"], "utf-8")
    else:
        path = require(f"models/templates/{case['template']}")
    return templates.load_template(None, str(path), e)


@pytest.mark.parametrize("name", sorted(GOLDENS["cases"]))
def test_rendered_chat_has_the_ids_llama_cpp_gives_the_same_text(name, tmp_path):
    case = GOLDENS["cases"][name]
    e = engine(case["vocab"])
    tools = GOLDENS["tools_case"]["tools"] if name.endswith("+tools") else None
    messages = GOLDENS["tools_case"]["messages"] if tools else GOLDENS["conversation"]
    prompt = templates.render_chat(template_of(case, e, tmp_path), messages, tools)
    assert prompt.text == case["text"]
    tokens = templates.tokenize_prompt(prompt, e.tokenize_marked)
    assert tokens.ids == case["ids"]
    if case["template"] is None:
        # Llama 2 writes " " + reply: SentencePiece's "▁Sure" starts in the template's
        # space, so no token starts where the reply does and its ids cannot be spliced.
        assert tokens.replies == {}
    else:  # the earlier replies lie on token boundaries, and their spans spell their text
        assert tokens.replies
        for message, (start, end) in tokens.replies.items():
            # (with a SentencePiece space prefix where the reply follows a marker; the
            # built-in ChatML renderer keeps a reply's calls with it)
            text = e.detokenize(tokens.ids[start:end]).decode().lstrip(" ")
            content = messages[message]["content"]
            assert text.startswith(content) if messages[message].get("tool_calls") else text == content


@pytest.mark.parametrize("name", sorted(GOLDENS["cases"]))
def test_markers_a_user_types_stay_text_in_every_family(name, tmp_path):
    case = GOLDENS["cases"][name]
    e = engine(case["vocab"])
    template = template_of(case, e, tmp_path)
    markers = {text for text, is_marker in templates.render_chat(template, GOLDENS["conversation"]).parts if is_marker}
    typed = " ".join(sorted(markers)) + " [INST] <|im_start|>"
    conversation = [{"role": "user", "content": typed}, {"role": "assistant", "content": typed},
                    {"role": "user", "content": "x" + typed}]
    prompt = templates.render_chat(template, conversation)
    ids = templates.tokenize_prompt(prompt, e.tokenize_marked).ids
    controls = [e.piece(i, special=True).decode() for i in ids if not e.piece(i) and e.piece(i, special=True)]
    assert controls == [text for text, is_marker in prompt.parts if is_marker]
    assert typed in e.detokenize(ids, special=True).decode()


def test_sentencepiece_space_prefix_only_at_the_start_and_after_markers():
    # Per part, the text after "[INST]" would get a second "▁"; in one call it does not.
    e = engine("llama-spm")
    text = b"[INST] Hi [/INST] ok"
    ids, offsets = e.tokenize_marked(text, [])
    assert ids == e.tokenize(text)
    pieces = [e.piece(i) for i in ids]
    assert b"".join(pieces) == b" " + text
    # Offsets count the input's bytes: the prefixed space belongs to the first token.
    assert offsets == [max(0, len(b"".join(pieces[:i])) - 1) for i in range(len(ids))]


def test_offsets_are_where_each_token_starts():
    e = engine("llama-bpe")
    text = "héllo <|eot_id|> wörld<|eot_id|>".encode()
    eot = text.index(b"<|eot_id|>", 10)
    ids, offsets = e.tokenize_marked(text, [(eot, eot + len(b"<|eot_id|>"))])
    pieces = [e.piece(i, special=True) for i in ids]
    assert b"".join(pieces) == text
    assert offsets == [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    assert ids.count(128009) == 1 and offsets[ids.index(128009)] == eot


def test_marker_ranges_must_be_sorted_and_inside_the_text():
    e = engine("llama-bpe")
    from llmd.engine.native import EngineError
    for ranges in ([(0, 99)], [(5, 3)], [(4, 6), (0, 2)]):
        with pytest.raises(EngineError, match="marker range"):
            e.tokenize_marked(b"hello world", ranges)


def test_inst_control_tokens_are_matched_only_where_the_template_writes_them(tmp_path):
    # A Mistral-shaped SentencePiece vocabulary where [INST] and [/INST] are control tokens.
    w = build_spm_vocab(["say hi and more words"], add_space_prefix=True)
    tokens, types, scores = (w.get(k).value[1] for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                                         "tokenizer.ggml.scores"))
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens + ["[INST]", "[/INST]"]))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types + [3, 3]))
    w.set("tokenizer.ggml.scores", ARRAY, (F32, scores + [0.0, 0.0]))
    template = tmp_path / "mistral.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}"
                        "[/INST]{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")
    with Engine(str(w.write(tmp_path / "mistral.gguf"))) as e:
        inst, end_inst = len(tokens), len(tokens) + 1
        t = templates.load_template(None, str(template), e)
        prompt = templates.render_chat(t, [{"role": "user", "content": "say [INST] hi [/INST]"}])
        ids = templates.tokenize_prompt(prompt, e.tokenize_marked).ids
        assert ids.count(inst) == 1 and ids.count(end_inst) == 1
        assert ids[1] == inst and ids[-1] == end_inst
        # After the marker, SentencePiece's prefix space, then the template's own space.
        assert e.detokenize(ids[2:-1]) == b"  say [INST] hi [/INST]"


def test_generated_ids_stand_in_for_a_reply_span():
    prompt = PromptIds([1, 10, 11, 12, 2, 13], bos=1, replies={(1, 4): "fp"})
    assert prompt.ids() == [1, 10, 11, 12, 2, 13]
    assert prompt.ids([("fp", [20, 21])]) == [1, 20, 21, 2, 13]
    assert prompt.ids([("other", [20])]) == [1, 10, 11, 12, 2, 13]
    assert PromptIds([10], bos=1).ids() == [1, 10]


def test_of_one_text_generated_as_several_ids_the_cached_ones_stand_in():
    """Two replies read the same (say both are bytes of invalid UTF-8, shown as
    U+FFFD) but were generated as other ids: each span takes the ids the session's
    cache holds there, so the prompt continues the cache; with no cache, the newest."""
    first, second = [20, 21], [22]
    slot = Slot("s")
    for ids in (first, second, first):  # a repeat is remembered once, as the newest
        slot.remember_reply("fp", ids)
    assert slot.replies == [("fp", second), ("fp", first)]
    prompt = PromptIds([1, 10, 11, 2, 12, 13, 2, 14], replies={(1, 3): "fp", (4, 6): "fp"})
    resident = [1, *first, 2, *second, 2]
    assert prompt.ids(slot.replies, resident) == [1, 20, 21, 2, 22, 2, 14]
    assert prompt.ids(slot.replies, resident[:3]) == [1, 20, 21, 2, 20, 21, 2, 14]
    assert prompt.ids(slot.replies) == [1, 20, 21, 2, 20, 21, 2, 14]
    for n in range(MAX_REPLIES + 1):
        slot.remember_reply(f"fp{n}", [n])
    assert len(slot.replies) == MAX_REPLIES and slot.replies[-1] == (f"fp{MAX_REPLIES}", [MAX_REPLIES])
