"""arch/lfm2.cpp and the recurrent session state (recurrent.h) on tiny random lfm2
models (tests/support/gguf_writer.py: build_tiny_lfm2): short-convolution layers interleaved
with attention layers, checked against llama.cpp, and the checkpoints through which a
recurrent state rewinds.

Golden numbers: `python -m tests.support.make_arch_golden LLAMA_DIR --tests tests.engine.test_arch_lfm2`
(llama-perplexity -c 128 -b 128, and a greedy continuation through libllama with the
top-2 logit margins) on exactly the models build() writes, with the llama.cpp of the
llama-cpp-python 0.3.36 sdist. Perplexity within PPL_TOLERANCE (F32; the Q8_0 model
within QUANTIZED_TOLERANCE, as in tests/engine/test_arch.py); greedy ids up to the first near-tie.
"""
from __future__ import annotations

import pytest

from llmd._native import lib
from llmd.engine.native import Engine, EngineError
from tests.conftest import running_llmd
from tests.support.gguf_writer import ARRAY, GGML_Q8_0, I32, build_tiny_lfm2, build_tiny_llama
from tests.support.llama_cpp_golden import golden_tests
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks,
    assert_sessions_are_isolated_under_concurrency, chat, model_client, open_error,
)

CONFIGS = {
    "lfm2": dict(),                                 # conv, attention, conv, conv, attention
    "lfm2_swa": dict(window=32),                    # its attention layers over a window of 32
    "lfm2_q8_0": dict(weight_type=GGML_Q8_0, conv_len=4),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "lfm2": (1339.5656,
        [131, 45, 63, 194, 253, 101, 40, 256, 48, 245, 79, 17],
        [0.615, 0.632, 0.056, 0.185, 1.398, 0.525, 1.12, 1.114, 1.704, 0.731, 0.07, 0.16]),
    "lfm2_swa": (1329.6079,
        [131, 45, 63, 194, 253, 101, 40, 256, 48, 245, 79, 17],
        [0.615, 0.632, 0.056, 0.185, 1.398, 0.525, 1.12, 1.114, 1.704, 0.832, 0.178, 0.327]),
    "lfm2_q8_0": (979.0584,
        [18, 150, 258, 55, 216, 83, 274, 251, 66, 230, 72, 94],
        [0.44, 0.331, 0.268, 0.177, 0.68, 0.617, 0.139, 0.011, 0.898, 1.586, 0.513, 0.961]),
}


def build(name: str):
    return build_tiny_lfm2(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


# ---- the session's memory ------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(models):
    with Engine(str(models["lfm2"]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module")
def ids(engine):
    return engine.tokenize(TEXT)[:100]


def test_convolution_layers_keep_a_state_instead_of_keys_and_values(engine):
    info = engine.info
    dim, kv_dim, conv_layers, attention_layers = 128, 2 * 32, 3, 2
    assert info.n_recurrent_layers == conv_layers
    assert info.kv_bytes_per_token == attention_layers * 2 * kv_dim * 2  # f16 keys and values
    # Each convolution layer keeps its last conv_len - 1 = 2 inputs of every channel,
    # once live and once per checkpoint it may hold.
    assert info.recurrent_bytes == conv_layers * 2 * dim * 4 * (1 + 8 + 2)  # the state, 8 checkpoints, a trail of 2
    assert info.bytes_per_session == info.kv_bytes_per_token * N_CTX + info.recurrent_bytes + info.n_vocab * 4
    # A prefix is shared as blocks and a snapshot of the state at their end.
    assert info.kv_shares_prefixes is True


def test_a_prefill_in_chunks_or_token_by_token_gives_exactly_the_same_logits(engine, ids):
    assert_prefill_does_not_depend_on_chunks(engine, ids)


def test_prefill_takes_a_checkpoint_where_it_starts_and_where_it_ends(engine, ids):
    with engine.new_session() as s:
        assert s.checkpoints == []
        s.prefill(ids[:10])
        assert s.checkpoints == [10]
        s.prefill(ids[10:30])
        assert s.checkpoints == [10, 30]
        s.decode_one(), s.decode_one(), s.decode_one()  # two of the three enter the state
        s.prefill(ids[30:40])                            # the reply's end, then the prompt's
        assert s.checkpoints == [10, 30, 32, 42]
        assert s.resume_points == [10, 30, 32, 42]


def test_checkpoints_are_bounded_and_the_newest_are_kept(engine, ids):
    with engine.new_session() as s:
        for i in range(0, 50, 5):
            s.prefill(ids[i:i + 5])
        assert s.checkpoints == list(range(15, 55, 5))  # 8 of them


def test_truncate_between_checkpoints_is_a_state_error_and_changes_nothing(engine, ids):
    with engine.new_session() as s, engine.new_session() as fresh:
        s.prefill(ids[:20])
        s.prefill(ids[20:40])
        with pytest.raises(EngineError, match=r"truncate position 30 is not a checkpoint .*return to 0, 20, 40, "
                                              r"or stay at 40") as err:
            s.truncate(30)
        assert err.value.status == lib.LLMD_ERR_STATE
        assert s.position == 40 and s.checkpoints == [20, 40]
        s.prefill(ids[40:50])
        fresh.prefill(ids[:50])
        assert s.logits() == fresh.logits()


def test_interleaved_sessions_decode_as_they_do_alone(engine, ids):
    assert_decode_batch_equals_decode_one(engine, [ids[:25], ids[30:70]])


def test_score_leaves_the_next_token_logits_as_prefill_does(engine, ids):
    with engine.new_session() as scored, engine.new_session() as prefilled:
        scored.score(ids[:40], 0)
        prefilled.prefill(ids[:40])
        assert scored.logits() == prefilled.logits()
        assert scored.checkpoints == [40]


# ---- files the engine refuses -------------------------------------------------------------

def test_a_layer_without_heads_needs_a_family_that_gives_it_a_state(tmp_path):
    w = build_tiny_llama(arch="qwen3", n_layer=2)
    w.set("qwen3.attention.head_count_kv", ARRAY, (I32, [0, 2]))
    assert "layer 0 has no attention heads, and the qwen3 architecture gives it no recurrent state" in \
        open_error(w.write(tmp_path / "headless.gguf"))


def test_per_layer_head_counts_must_agree_where_nonzero(tmp_path):
    w = build_tiny_lfm2(kv_heads=(0, 2, 0, 4))
    assert "gives layers different values" in open_error(w.write(tmp_path / "mixed.gguf"))


def test_lfm2_without_a_convolution_length_is_refused(tmp_path):
    w = build_tiny_lfm2()
    w.remove("lfm2.shortconv.l_cache")
    assert "lacks lfm2.shortconv.l_cache" in open_error(w.write(tmp_path / "no_conv.gguf"))


def test_lfm2_keeps_its_final_norm_under_its_own_name(tmp_path):
    w = build_tiny_lfm2()
    w.tensor("token_embd_norm.weight").name = "output_norm.weight"
    assert "lfm2 keeps its final norm in token_embd_norm.weight" in open_error(w.write(tmp_path / "norm.gguf"))


def test_a_convolution_filter_of_the_wrong_shape_is_refused(tmp_path):
    w = build_tiny_lfm2()
    w.tensor("blk.0.shortconv.conv.weight").ne = [2, 192]
    assert "blk.0.shortconv.conv.weight should be F32 of shape [3, 128]" in open_error(w.write(tmp_path / "f.gguf"))


# ---- sessions through HTTP ----------------------------------------------------------------

@pytest.fixture(scope="module")
def server(models):
    with running_llmd("--model", str(models["lfm2"]), "--max-sessions", "6", "--ctx", "128",
                      "--session-eviction", "none") as url:
        yield model_client(url)


def test_a_conversation_resumes_from_the_live_state_and_answers_as_a_cold_request(server):
    turn = [{"role": "user", "content": "the quick brown fox"}]
    first = chat(server, turn, "appends")
    reply = first["choices"][0]["message"]["content"]
    history = turn + [{"role": "assistant", "content": reply}, {"role": "user", "content": "hello there"}]
    warm, cold = chat(server, history, "appends"), chat(server, history)
    total = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert warm["session_reset_reason"] in ("exact_prefix", "common_prefix", "checkpoint")
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= total - 1
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]


def test_a_rewritten_reply_resumes_from_the_checkpoint_where_its_prompt_ended(server):
    turn = [{"role": "user", "content": "the quick brown fox"}]
    first = chat(server, turn, "rewritten")
    history = turn + [{"role": "assistant", "content": "jumps over the lazy dog"},
                      {"role": "user", "content": "hello there"}]
    warm, cold = chat(server, history, "rewritten"), chat(server, history)
    # The common prefix ends inside the given reply ("checkpoint") or where it starts.
    assert warm["session_reset_reason"] in ("checkpoint", "common_prefix")
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"]
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]


def test_sessions_are_isolated_under_concurrency(server):
    assert_sessions_are_isolated_under_concurrency(server)


def test_session_dir_saves_a_recurrent_model_s_sessions_and_restores_them_after_a_restart(models, tmp_path):
    log = tmp_path / "log.txt"
    turn = [{"role": "user", "content": "hello"}]
    args = ("--model", str(models["lfm2"]), "--max-sessions", "3", "--session-dir", str(tmp_path / "dir"))
    with open(log, "w") as stderr, running_llmd(*args, stderr=stderr) as url:
        first = chat(model_client(url), turn, "kept")
    assert "recurrent layers" not in log.read_text() and "session 'kept' saved to disk" in log.read_text()
    # The reply in the history is given text (the random model's bytes need not
    # tokenize back to its ids): the restored session resumes from the checkpoint the
    # file kept where its first prompt ended, and answers as a cold request does.
    history = turn + [{"role": "assistant", "content": "jumps over the lazy dog"},
                      {"role": "user", "content": "and again"}]
    with running_llmd(*args) as url:
        client = model_client(url)
        restored, cold = chat(client, history, "kept"), chat(client, history)
    assert restored["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"]
    assert restored["choices"][0]["message"] == cold["choices"][0]["message"]
