"""arch/gemma.cpp's gemma3 on tiny random gemma3 models (tests/support/gguf_writer.py:
build_tiny_gemma3): heads of 256, sliding-window layers whose window (32) is far
shorter than the context (384), so that their rings wrap, checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 384 -b 384) and a greedy
continuation through libllama (n_ctx 384, top-2 log-prob margins) on exactly the
models build() writes, with the llama.cpp of the llama-cpp-python 0.3.36 sdist.
Perplexity must agree within PPL_TOLERANCE; greedy ids until the first near-tie.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine, EngineError
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import ARRAY, F32, GGML_Q8_0, I32, STRING, U8, U32, build_tiny_gemma3
from tests.support.llama_cpp_golden import golden_tests
from tests.engine.test_arch import (
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
        "father had taught him: one hundred and twelve, no more and no less. At the top he trimmed the wick, "
        "polished the great lens with a soft cloth, and struck a match against the iron rail. The flame caught, "
        "wavered, and then stood tall, and the beam began its slow sweep across the water. Ships he would never "
        "meet steered by it; fishermen coming home late counted its flashes to know which bay they had reached. "
        "In winter the wind shook the tower so hard that the oil trembled in its bowl, and he would sit beside it "
        "through the night with a blanket over his knees, reading by the light meant for others. He kept a log "
        "of every storm, every wreck he saw or heard of, every bird that struck the glass. The pages filled slowly. "
        "Nobody asked to read them, and he did not expect anyone to, yet he wrote each entry with care, the date "
        "first, then the weather, then whatever the sea had done that day. When the inspector came in spring he "
        "looked at the log, nodded, and said nothing, which the keeper took as the highest praise.")
N_CTX = 384          # one llama-perplexity chunk (it needs 2 × N_CTX tokens); 192..383 scored
WINDOW = 32
PROMPT_TOKENS = 350  # greedy continuations start after TEXT's first 350 tokens
GREEDY_STEPS = 12
PPL_TOLERANCE = 0.005

CONFIGS = {
    "gemma3": dict(),                                               # period 6: 5 local, 1 global
    "gemma3_softcap": dict(pattern=3, rope_base_local=20000.0, softcap=5.0),
    "gemma3_q8_0": dict(weight_type=GGML_Q8_0, n_embd=128, n_head=4, n_head_kv=2),
    # YaRN on the global layers; the local ones turn unscaled with the context's magnitude
    # factor, not YaRN's (HParams::LocalRope::unscaled)
    "gemma3_yarn": dict(yarn=(4.0, 96)),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "gemma3": (6237.1014,
               [126, 188, 222, 189, 280, 157, 281, 222, 189, 188, 226, 109],
               [0.822, 0.975, 0.155, 1.283, 0.603, 0.323, 1.048, 1.869, 2.246, 1.053, 1.951, 0.555]),
    "gemma3_softcap": (1806.1639,
                       [126, 188, 195, 43, 296, 280, 157, 43, 296, 109, 154, 188],
                       [0.359, 0.354, 0.213, 0.311, 0.251, 0.3, 0.169, 0.282, 0.128, 0.041, 0.093, 0.24]),
    "gemma3_q8_0": (25507.5531,
                    [143, 0, 33, 200, 184, 104, 184, 271, 224, 131, 131, 131],
                    [0.187, 1.348, 0.212, 0.333, 0.393, 1.688, 0.633, 0.209, 0.864, 1.114, 1.093, 0.78]),
    "gemma3_yarn": (6145.2869,
                    [126, 188, 222, 189, 280, 157, 281, 222, 189, 188, 226, 109],
                    [0.775, 0.985, 0.019, 1.416, 0.299, 0.337, 0.79, 1.942, 2.169, 1.044, 2.054, 0.566]),
}


def build(name: str):
    options = dict(CONFIGS[name])
    yarn = options.pop("yarn", None)
    w = build_tiny_gemma3(n_ctx=N_CTX, window=WINDOW, **options)
    if yarn is not None:
        w.set("gemma3.rope.scaling.type", STRING, "yarn")
        w.set("gemma3.rope.scaling.factor", F32, yarn[0])
        w.set("gemma3.rope.scaling.original_context_length", U32, yarn[1])
    return w


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, PPL_TOLERANCE)


@pytest.fixture(scope="module")
def engine(models):
    with Engine(str(models["gemma3"]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module")
def local_engine(tmp_path_factory):
    """Every layer a sliding window: what these tests compare bit for bit is the rings,
    not how a global layer's long context is split over threads."""
    path = build_tiny_gemma3(n_ctx=N_CTX, window=WINDOW, pattern=0).write(
        tmp_path_factory.mktemp("local") / "local.gguf")
    with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module")
def ids(engine):
    return engine.tokenize(TEXT)


def test_sliding_window_layers_keep_a_ring_and_capacity_counts_it(engine):
    info = engine.info
    kv_row = 2 * 256 * 2  # keys and values of one KV head of 256, f16
    # Five local layers keep a ring of the window plus one forward batch (256), in
    # blocks of 16 positions; the global layer keeps every position.
    assert info.kv_bytes_per_token == 1 * kv_row
    assert info.kv_ring_bytes == 5 * 288 * kv_row
    assert info.bytes_per_session == info.kv_bytes_per_token * N_CTX + info.kv_ring_bytes + info.n_vocab * 4
    sessions, per_session = engine.capacity(10 * info.bytes_per_session)
    assert (sessions, per_session) == (10, info.bytes_per_session)


@pytest.mark.parametrize("element", [I32, U32], ids=["int32", "uint32"])
def test_a_per_layer_window_pattern_reads_as_bools_or_integers(tmp_path, element):
    """llama.cpp's own writer (test-llama-archs) gives the pattern as uint32 per layer:
    it means what the same bools mean."""
    flags = [True, False, True, False, True, True]
    as_bools = build_tiny_gemma3(pattern=flags).write(tmp_path / "b.gguf")
    w = build_tiny_gemma3(pattern=flags)
    w.set("gemma3.attention.sliding_window_pattern", ARRAY, (element, [int(f) for f in flags]))
    as_ints = w.write(tmp_path / "i.gguf")
    with Engine(str(as_bools), n_threads=1, max_sessions=1) as a, Engine(str(as_ints), n_threads=1, max_sessions=1) as b:
        assert (a.info.kv_bytes_per_token, a.info.kv_ring_bytes) == (b.info.kv_bytes_per_token, b.info.kv_ring_bytes)
        assert a.info.kv_ring_bytes > 0 and a.info.kv_bytes_per_token > 0  # both kinds of layer are there


def test_a_per_layer_window_pattern_of_bytes_is_refused_as_llama_cpp_refuses_it(tmp_path):
    w = build_tiny_gemma3()
    w.set("gemma3.attention.sliding_window_pattern", ARRAY, (U8, [1, 0, 1, 0, 1, 1]))
    assert "sliding_window_pattern must be one bool, int32 or uint32 per layer" in open_error(
        w.write(tmp_path / "p.gguf"))


def test_a_long_context_needs_less_than_full_attention_memory(models):
    with Engine(str(models["gemma3"]), n_threads=1, n_ctx=8192, max_sessions=2) as e:
        full = 6 * 2 * 256 * 2 * 8192
        assert e.info.kv_bytes_per_token * 8192 + e.info.kv_ring_bytes < full / 4


def test_logits_do_not_depend_on_chunks_or_decode_steps(local_engine, ids):
    """Past the rings' wrap: one prefill, odd chunks, and token-by-token steps give
    bit-identical logits at the last position."""
    assert_prefill_does_not_depend_on_chunks(local_engine, ids[:340])


def test_decode_batch_equals_decode_one_on_gemma3(engine, ids):
    assert_decode_batch_equals_decode_one(engine, [ids[:330], ids[5:40]])


def test_resume_floor_follows_the_ring(engine, ids):
    with engine.new_session() as s:
        s.prefill(ids[:200])
        assert s.resume_floor == 0  # nothing overwritten yet: 288 slots
        s.prefill(ids[200:350])
        # Position 349 overwrote 0..61; position 62 + 31 is the first whose window is whole.
        assert s.resume_floor == 349 - 288 + 1 + WINDOW - 1
        s.reset()
        assert s.resume_floor == 0


def test_truncate_at_or_past_the_floor_resumes_exactly(local_engine, ids):
    engine = local_engine
    with engine.new_session() as s:
        s.prefill(ids[:350])
        s.prefill(ids[350:360])  # more overwrites: the floor moves on
        keep = s.resume_floor
        s.truncate(keep)
        s.prefill(ids[keep:380])
        resumed = s.logits()
    with engine.new_session() as fresh:
        fresh.prefill(ids[:380])
        assert fresh.logits() == resumed


def test_truncate_before_the_floor_is_refused_and_changes_nothing(local_engine, ids):
    engine = local_engine
    with engine.new_session() as s:
        s.prefill(ids[:350])
        floor = s.resume_floor
        with pytest.raises(EngineError, match="sliding-window"):
            s.truncate(floor - 1)
        assert s.position == 350
        s.prefill(ids[350:352])
        kept = s.logits()
        s.truncate(0)
        s.prefill(ids[:352])
        assert s.logits() == kept


def test_server_reprefills_when_a_resume_would_cut_into_a_wrapped_ring(models):
    """Warm resume through the runtime: a prompt sharing only a short prefix with a
    long resident context is planned as "window" (keep 0) and answers as a fresh
    session does; a prompt that continues a short resident context reuses it."""
    with running_llmd("--model", str(models["gemma3"]), "--ctx", str(N_CTX), "--max-sessions", "3",
                      "--threads", "2") as url:
        client = Client(url + "/v1", model="gemma3")  # the file stem

        def complete(prompt: str, sid: str) -> dict:
            body = client.completion_body(prompt, max_tokens=6, temperature=0, session_id=sid)
            resp = client.post_json("/completions", body)
            assert resp.status == 200, resp.body
            return resp.json()

        long = complete(TEXT[:440], "w")
        assert long["usage"]["prompt_tokens"] > 288 + WINDOW  # the rings wrapped
        edited = TEXT[:60] + " and then the sea rose over the rocks"
        again = complete(edited, "w")
        assert again["session_reset_reason"] == "window"
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        fresh = complete(edited, "fresh")
        assert again["choices"][0]["text"] == fresh["choices"][0]["text"]
        longer = complete(edited + " again and again", "w")  # the rings have not wrapped
        assert longer["session_reset_reason"] == "common_prefix"  # up to the generated text
        assert longer["usage"]["prompt_tokens_details"]["cached_tokens"] >= again["usage"]["prompt_tokens"] - 1
