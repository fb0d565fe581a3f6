"""The tokenizers of native/src/tokenizer/ (vocab.cpp, pretokenize.cpp) against llama.cpp.

Three kinds of reference:
  - llama.cpp's own vectors (models/ggml-vocab-*.gguf + .inp/.out, fetched once by
    `python -m tests.reference_data`), compared as tests/test-tokenizer-0.cpp does;
  - tests/data/tokenizer_goldens.json: hard cases (digits, CJK, emoji, long
    whitespace, control tokens typed as text, ...) as llama.cpp tokenizes them with
    those vocabularies, and the special ids it settles on (written by
    tests/data/gen_tokenizer_goldens.py);
  - pre-tokenizers without a vocabulary file here (tekken, gpt-4o, deepseek-v3, ...)
    on a vocabulary built by gguf_writer.build_split_vocab, whose ids show the split.
"""
from __future__ import annotations

import dataclasses

import json
import random
from pathlib import Path

import pytest

from llmd._native import lib
from llmd.engine.native import Engine, EngineError
from tests.support.gguf_writer import build_spm_vocab, build_split_vocab
from tests.reference_data import require

GOLDENS = json.loads((Path(__file__).parents[1] / "data" / "tokenizer_goldens.json").read_text())
CASES = GOLDENS["cases"]

# Vocabularies with vectors, and how many distinct cases each holds (what
# test-tokenizer-0 runs: its cases live in a map, so a repeated input counts once).
VECTORS = {"command-r": 46, "deepseek-coder": 46, "deepseek-llm": 46, "falcon": 46, "gemma-4": 46, "gpt-2": 46,
           "llama-bpe": 46, "llama-spm": 46, "mpt": 46, "phi-3": 46, "qwen2": 46, "qwen35": 50, "refact": 46,
           "starcoder": 46}
# Vocabulary types llmd does not implement: refused by name.
REFUSED = {"bert-bge": "unsupported tokenizer model 'bert' (WordPiece)",
           "nomic-bert-moe": "unsupported tokenizer model 't5' (Unigram)"}


def vocab_path(name: str) -> Path:
    return require(f"models/ggml-vocab-{name}.gguf")


_engines: dict[str, Engine] = {}


def engine(name: str) -> Engine:
    """One vocab-only engine per vocabulary for the whole module (some take a second to load)."""
    if name not in _engines:
        _engines[name] = Engine(str(vocab_path(name)))
    return _engines[name]


def teardown_module() -> None:
    for e in _engines.values():
        e.close()
    _engines.clear()


def read_vectors(name: str) -> dict[str, list[int]]:
    """The .inp/.out pairs exactly as test-tokenizer-0 reads them."""
    raw = Path(str(vocab_path(name)) + ".inp").read_bytes().decode("utf-8")
    sep, inputs, pos = "\n__ggml_vocab_test__\n", [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(sep)
    outputs = Path(str(vocab_path(name)) + ".out").read_text(encoding="utf-8").split("\n")
    if outputs and outputs[-1] == "":
        outputs.pop()  # std::getline yields no line after the final newline
    assert len(inputs) == len(outputs)
    return {text: [int(t) for t in line.strip().split()] for text, line in zip(inputs, outputs)}


# ---- llama.cpp's vectors --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(VECTORS))
def test_reference_vectors_pass_as_test_tokenizer_0_compares_them(name):
    vectors = read_vectors(name)
    e = engine(name)
    failed = [(text, want, got) for text, want in vectors.items() if (got := e.tokenize(text)) != want]
    assert not failed, f"{len(vectors) - len(failed)}/{len(vectors)} passed; first failure: {failed[0]!r}"
    assert len(vectors) == VECTORS[name]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_tokenizer_types_are_refused_by_name(name):
    with pytest.raises(EngineError, match=REFUSED[name].replace("(", r"\(").replace(")", r"\)")) as exc:
        Engine(str(vocab_path(name)))
    assert exc.value.status == lib.LLMD_ERR_UNSUPPORTED


# ---- hard cases and special ids, against llama.cpp -------------------------------------

WITH_IDS = sorted(name for name, v in GOLDENS["vocabs"].items() if "ids" in v)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", WITH_IDS)
def test_hard_cases_match_llama_cpp(name, case):
    assert engine(name).tokenize(CASES[case]) == GOLDENS["vocabs"][name]["ids"][case]


@pytest.mark.parametrize("name", WITH_IDS)
def test_control_tokens_typed_as_text_stay_text_unless_parsing_is_asked_for(name):
    e, golden = engine(name), GOLDENS["vocabs"][name]
    text = CASES["control_text"]
    assert e.tokenize(text, special=True) == golden["ids_parse_special"]
    as_text = e.tokenize(text)
    assert as_text == golden["ids"]["control_text"]
    # Parsed or not, the pieces spell the same bytes; as text, no id is a control token.
    assert not any(e.piece(i) == b"" for i in as_text)


@pytest.mark.parametrize("name", sorted(GOLDENS["vocabs"]))
def test_special_ids_and_end_of_generation_set_match_llama_cpp(name):
    info, golden = engine(name).info, GOLDENS["vocabs"][name]
    assert (info.bos_id, info.eos_id, info.add_bos) == (golden["bos"], golden["eos"], golden["add_bos"])
    assert list(info.eog_ids) == golden["eog"]


# Fill-in-the-middle markers (pre, suf, mid, rep, sep) as llama.cpp's print_info names them
# (0c1e570); the other vocabularies have none.
FIM = {"deepseek-coder": (32016, 32015, 32017, None, None), "refact": (1, 3, 2, 18, None),
       "starcoder": (1, 3, 2, None, None)}


@pytest.mark.parametrize("name", sorted(GOLDENS["vocabs"]))
def test_fill_in_the_middle_markers_match_llama_cpp(name):
    fim = engine(name).info.fim
    assert (fim and dataclasses.astuple(fim)) == FIM.get(name)


def test_llama3_without_add_bos_token_gets_bos_and_spm_adds_it_by_default():
    # ggml-vocab-llama-bpe.gguf has no add_bos_token key; llama.cpp adds BOS for llama-bpe.
    assert engine("llama-bpe").info.add_bos and engine("llama-bpe").info.bos_id == 128000
    assert engine("baichuan").info.add_bos  # SentencePiece without the key


@pytest.mark.parametrize("pre", sorted(GOLDENS["split_vocabs"]))
def test_pre_tokenizer_splits_words_as_llama_cpp_does(pre, tmp_path):
    path = build_split_vocab(list(CASES.values()), pre).write(tmp_path / f"{pre}.gguf")
    with Engine(str(path)) as e:
        got = {case: e.tokenize(text) for case, text in CASES.items()}
    assert got == GOLDENS["split_vocabs"][pre]["ids"]


@pytest.mark.parametrize("prefix", [False, True])
def test_sentencepiece_in_gemma_shape_matches_llama_cpp(prefix, tmp_path):
    # Scores, byte fallback (emoji outside the vocabulary), add_space_prefix as the file says.
    golden = GOLDENS["spm_vocabs"][f"add_space_prefix={prefix}"]
    path = build_spm_vocab(list(CASES.values()), add_space_prefix=prefix).write(tmp_path / "spm.gguf")
    with Engine(str(path)) as e:
        assert {case: e.tokenize(text) for case, text in CASES.items()} == golden["ids"]
        assert e.tokenize(CASES["control_text"], special=True) == golden["ids_parse_special"]
        assert (e.info.bos_id, e.info.eos_id, e.info.add_bos) == (golden["bos"], golden["eos"], golden["add_bos"])
        assert list(e.info.eog_ids) == golden["eog"]


def test_split_vocabulary_tells_pre_tokenizers_apart():
    # The split test means something only if different splits give different ids.
    splits = GOLDENS["split_vocabs"]
    assert splits["tekken"]["ids"]["case_runs"] != splits["llama3"]["ids"]["case_runs"]
    assert splits["gpt-4o"]["ids"]["digits"] != splits["qwen2"]["ids"]["digits"]
    assert splits["deepseek-v3"]["ids"]["cjk"] != splits["qwen35"]["ids"]["cjk"]


# Every name llama.cpp accepts for a pre-tokenizer llmd implements.
PRE_NAMES = """llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano dbrx smaug-bpe
chatglm-bpe glm4 glm5 jais-2 deepseek-llm deepseek-coder deepseek-v3 hunyuan-dense joyai-llm hy_v4 falcon starcoder
refact command-r smollm codeshell exaone minerva-7b mellum2 gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es
jina-v2-de a.x-4.0 mellum modern-bert mpt olmo jais trillion granite-docling exaone4 qwen2 deepseek-r1-qwen kormo
f2llmv2 megrez stablelm2 hunyuan solar-open grok-2 qwen35 ufakzeka laguna poro-chat bloom gpt3-finnish viking tekken
gpt-4o llama4 kanana2 talkie minimax-m2 chameleon bailingmoe bailingmoe2 llada-moe seed-coder exaone-moe minicpm5
default""".split()


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_every_supported_pre_tokenizer_name_loads(pre, tmp_path):
    path = build_split_vocab(["Hello world 123"], pre).write(tmp_path / "v.gguf")
    with Engine(str(path)) as e:
        assert e.info.vocab_only and e.info.tokenizer_pre == pre
        assert b"".join(e.piece(i) for i in e.tokenize("Hello world 123")) == b"Hello world 123"


def test_unknown_pre_tokenizer_is_refused_with_the_supported_list(tmp_path):
    path = build_split_vocab(["x"], "qwen9").write(tmp_path / "v.gguf")
    with pytest.raises(EngineError) as exc:
        Engine(str(path))
    assert exc.value.status == lib.LLMD_ERR_UNSUPPORTED
    message = str(exc.value)
    assert "unsupported pre-tokenizer 'qwen9'" in message
    assert all(name in message.split() for name in ("llama-bpe", "qwen2", "tekken", "gpt-4o", "deepseek-v3"))


# ---- behaviour of our own --------------------------------------------------------------

def _byte_samples() -> list[bytes]:
    rng = random.Random(7)
    samples = [b"\xff", b"\xc3", b"a\x80b", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xe2\x82 x\xc0\xaf"]
    return samples + [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) for _ in range(40)]


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_invalid_utf8_never_crashes(name):
    e = engine(name)
    for data in _byte_samples():
        ids = e.tokenize(data)
        assert ids and all(0 <= i < e.info.n_vocab for i in ids)


@pytest.mark.parametrize("name", ["llama-spm", "gemma-4", "qwen2", "llama-bpe"])
def test_invalid_utf8_bytes_come_back_from_the_pieces(name):
    # llama.cpp reads an invalid byte as U+FFFD in BPE; llmd keeps the byte, so the
    # pieces give back the input (where, unlike DeepSeek's or Falcon's, the
    # vocabulary has a plain token for every byte).
    e = engine(name)
    prefix = b" " if name == "llama-spm" else b""  # SentencePiece's space prefix
    for data in _byte_samples():
        ids = e.tokenize(data)
        assert b"".join(e.piece(i) for i in ids) == prefix + data.replace("\u2581".encode(), b" ")


def test_user_defined_tokens_are_matched_even_in_plain_text():
    # As in llama.cpp (and HF tokenizers): only control tokens wait for parse_special.
    e = engine("command-r")
    assert e.tokenize("<|USER_TOKEN|>") == e.tokenize("<|USER_TOKEN|>", special=True) == [255006]
    assert e.tokenize("<|END_OF_TURN_TOKEN|>", special=True) == [255001]
    assert len(e.tokenize("<|END_OF_TURN_TOKEN|>")) > 1


def test_sentencepiece_puts_a_space_before_text_only_at_the_start_and_after_special_tokens():
    e = engine("llama-spm")
    hello = e.tokenize("Hello")
    assert e.piece(hello[0]).startswith(b" ")
    assert e.tokenize("</s>Hello", special=True) == [2] + hello
    assert e.tokenize("") == []


def test_long_whitespace_runs_tokenize_quickly_and_completely():
    for name in ("qwen2", "llama-bpe", "llama-spm", "deepseek-llm", "gemma-4"):
        e = engine(name)
        text = " " * 20000 + "x" + "\n" * 20000 + "\t" * 5000 + " " * 20000 + "\U0001F600"
        ids = e.tokenize(text)
        out = b"".join(e.piece(i) for i in ids)
        assert out.lstrip(b" ") == text.encode().lstrip(b" ")


def test_a_vocab_only_engine_tokenizes_and_refuses_to_generate():
    e = engine("llama-bpe")
    assert e.info.vocab_only and e.info.n_vocab == 128256 and e.info.max_sessions == 0
    assert e.tokenize("Hello world") == [9906, 1917]
    with pytest.raises(EngineError, match="holds only a vocabulary") as exc:
        e.new_session()
    assert exc.value.status == lib.LLMD_ERR_UNSUPPORTED
    with pytest.raises(EngineError, match="holds only a vocabulary"):
        e.capacity(1 << 30)


def test_add_bos_and_add_eos_keys_override_the_defaults(tmp_path):
    from tests.support.gguf_writer import BOOL, U32
    w = build_split_vocab(["x"], "llama-bpe")  # llama-bpe adds BOS by default
    w.set("tokenizer.ggml.bos_token_id", U32, 5)
    w.set("tokenizer.ggml.eos_token_id", U32, 6)
    with Engine(str(w.write(tmp_path / "a.gguf"))) as e:
        assert (e.info.bos_id, e.info.add_bos, e.info.eos_id, e.info.add_eos) == (5, True, 6, False)
    w.set("tokenizer.ggml.add_bos_token", BOOL, False)
    w.set("tokenizer.ggml.add_eos_token", BOOL, True)
    with Engine(str(w.write(tmp_path / "b.gguf"))) as e:
        assert (e.info.add_bos, e.info.add_eos) == (False, True)
