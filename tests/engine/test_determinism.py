"""Same input, same output: one token's logits are bit-identical however it is computed.

The engine promises that a token's logits depend only on the tokens before it: not on
how a prefill is chunked, not on whether the token is prefilled or decoded, decoded
alone or batched with other sessions' tokens, not on a warm resume (truncate, then
prefill the rest) versus a cold prefill, and not on the thread count. These tests
compare raw float bits, never a tolerance, for every architecture and weight format
of the lists below, on contexts long enough that attention splits them into several
ranges (attention.h), and on the real default model; each with the KV cache in f16
and, per architecture, quantized (KV_TYPES: the promise holds within a KV type).

Adding an architecture or a weight format is one entry in ARCHITECTURES or
WEIGHT_TYPES (WIDE_* for formats that need rows of whole 256-element super-blocks);
a KV type, one entry in KV_TYPES.
"""
from __future__ import annotations

import concurrent.futures
import random
from types import SimpleNamespace

import pytest

from llmd._native import ffi, lib
from llmd.engine.native import Engine, Sampling, Session
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import (GGML_BF16, GGML_F16, GGML_F32, GGML_IQ4_NL, GGML_IQ4_XS, GGML_MXFP4, GGML_Q2_K,
                               GGML_Q3_K, GGML_Q4_0, GGML_Q4_1, GGML_Q4_K, GGML_Q5_0, GGML_Q5_1, GGML_Q5_K,
                               GGML_Q6_K, GGML_Q8_0, build_tiny_gemma3, build_tiny_gpt_oss)

MODEL = "SmolLM2-135M-Instruct"

# ---- the models ------------------------------------------------------------------------

N_CTX = 1024  # the tiny models' context: room for the long sequences below


def tiny(arch: str):
    """make(factory, weight_type) for a tiny model of `arch`: two KV heads of two query
    heads each, head_dim 32 (the fast attention kernel)."""
    def make(factory, weight_type: int):
        return factory(arch=arch, weight_type=weight_type, n_embd=128, n_head=4, n_head_kv=2, n_ff=256,
                       n_layer=2, n_ctx=N_CTX)
    return make


def tiny_gemma3(factory, weight_type: int):
    """A tiny gemma3: heads of 256, global layers and sliding-window layers whose window
    (512) the long sequences below pass, so windows start inside a range; written once
    per weight type next to the factory's models."""
    path = factory(weight_type=weight_type).path.with_name(f"gemma3-{weight_type}.gguf")
    if not path.exists():
        build_tiny_gemma3(n_layer=3, pattern=3, n_ctx=N_CTX, window=512, weight_type=weight_type).write(path)
    return SimpleNamespace(path=path)


def tiny_gpt_oss(factory, weight_type: int):
    """A tiny gpt-oss: attention sinks in every layer, the even layers over a window of
    512 that the long sequences below pass (so windows start inside a range; the rings
    hold the 600 positions the warm resume truncates), 2 of 4 experts a token; written
    once per weight type next to the factory's models."""
    path = factory(weight_type=weight_type).path.with_name(f"gpt-oss-{weight_type}.gguf")
    if not path.exists():
        build_tiny_gpt_oss(n_embd=128, n_ctx=N_CTX, window=512, weight_type=weight_type).write(path)
    return SimpleNamespace(path=path)


# name -> make(tiny_llama_factory, weight_type) -> a model whose .path is its GGUF file
ARCHITECTURES = {"llama": tiny("llama"), "qwen2": tiny("qwen2"), "qwen3": tiny("qwen3"),
                 "qwen3moe": tiny("qwen3moe"), "smollm3": tiny("smollm3"), "phi3": tiny("phi3"),
                 "gemma3": tiny_gemma3, "gpt-oss": tiny_gpt_oss}
WEIGHT_TYPES = {"F32": GGML_F32, "F16": GGML_F16, "Q8_0": GGML_Q8_0, "Q4_0": GGML_Q4_0, "Q4_1": GGML_Q4_1}


def wide(arch: str):
    """As tiny(arch), with rows of 256 and 512 columns: whole super-blocks, as the
    K-quants and IQ4_XS need."""
    def make(factory, weight_type: int):
        return factory(arch=arch, weight_type=weight_type, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                       n_layer=2, n_ctx=N_CTX)
    return make


# The other formats, each on two architectures.
WIDE_ARCHITECTURES = {"llama": wide("llama"), "qwen3": wide("qwen3")}
WIDE_WEIGHT_TYPES = {"BF16": GGML_BF16, "Q5_0": GGML_Q5_0, "Q5_1": GGML_Q5_1, "IQ4_NL": GGML_IQ4_NL,
                     "MXFP4": GGML_MXFP4, "Q2_K": GGML_Q2_K, "Q3_K": GGML_Q3_K, "Q4_K": GGML_Q4_K,
                     "Q5_K": GGML_Q5_K, "Q6_K": GGML_Q6_K, "IQ4_XS": GGML_IQ4_XS}
# KV cache types (keys, values) beside f16, each on every architecture with Q8_0 weights.
KV_TYPES = {"kv_q8_0": ("q8_0", "q8_0"), "kv_q4_0": ("q4_0", "q4_0"), "kv_q8_0-f16": ("q8_0", "f16")}
MODELS = [pytest.param((make, wtype, ("f16", "f16")), id=f"{arch}-{wname}")
          for archs, types in ((ARCHITECTURES, WEIGHT_TYPES), (WIDE_ARCHITECTURES, WIDE_WEIGHT_TYPES))
          for arch, make in archs.items() for wname, wtype in types.items()] + [
          pytest.param((make, GGML_Q8_0, kv), id=f"{arch}-Q8_0-{kname}")
          for arch, make in ARCHITECTURES.items() for kname, kv in KV_TYPES.items()]


@pytest.fixture(scope="module", params=MODELS)
def engines(request, tiny_llama_factory):
    """{1: engine with one thread, 2: engine with two} on one tiny model and KV type."""
    make, weight_type, (kv_k, kv_v) = request.param
    model = make(tiny_llama_factory, weight_type)
    opened = {n: Engine(model.path, n_threads=n, max_sessions=8, kv_type_k=kv_k, kv_type_v=kv_v) for n in (1, 2)}
    yield opened
    for e in opened.values():
        e.close()


@pytest.fixture(scope="module", params=["f16", "q8_0", "q4_0"])
def default_engines(request):
    """The default model with one and with two threads, its KV cache of each type."""
    from llmd.engine import fetch

    path = str(fetch.default_model(fetch=False))
    opened = {n: Engine(path, n_threads=n, n_ctx=1024, max_sessions=8, kv_type_k=request.param,
                        kv_type_v=request.param) for n in (1, 2)}
    yield opened
    for e in opened.values():
        e.close()


def sequence(engine: Engine, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(engine.info.n_vocab) for _ in range(n)]


# ---- how a sequence's logits are computed ---------------------------------------------------

def logits_bits(session: Session) -> bytes:
    """The raw float32 logits (Session.logits() without the list of Python floats)."""
    n = session._engine.info.n_vocab
    out = ffi.new("float[]", n)
    assert lib.llmd_session_logits(session.handle, out, n) == lib.LLMD_OK
    return bytes(ffi.buffer(out))


def prefill_in_chunks(engine: Engine, ids: list[int], chunk: int) -> dict[int, bytes]:
    """Prefills ids into a fresh session `chunk` tokens per call: {position of the
    last token of each call: the logits after it}."""
    out = {}
    with engine.new_session() as s:
        for i in range(0, len(ids), chunk):
            s.prefill(ids[i:i + chunk])
            out[min(i + chunk, len(ids)) - 1] = logits_bits(s)
    return out


# Every other prompt samples, seeded: sampled ids depend only on the seed and the logits.
SAMPLINGS = [Sampling(), Sampling(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)]


def decode_alone(engine: Engine, prompt: list[int], steps: int, sampling: Sampling) -> tuple[list[int], bytes]:
    """Decodes `steps` tokens one at a time: (their ids, the logits after the last,
    fed by a one-token prefill)."""
    with engine.new_session() as s:
        s.set_sampling(sampling)
        s.prefill(prompt)
        ids = [s.decode_one().id for _ in range(steps)]
        s.prefill(ids[-1:])
        return ids, logits_bits(s)


def check_chunking_and_threads(engines: dict[int, Engine], ids: list[int]) -> None:
    # One token per call on one thread: every position, the decode-shaped arithmetic.
    reference = prefill_in_chunks(engines[1], ids, 1)
    for threads, chunk in [(2, 1), (2, 7), (2, 64), (2, 256), (2, len(ids)), (1, 64), (1, len(ids))]:
        for pos, bits in prefill_in_chunks(engines[threads], ids, chunk).items():
            assert bits == reference[pos], f"{threads} threads, chunks of {chunk}: position {pos} differs"


def check_decode_alone_and_batched(engine: Engine, prompts: list[list[int]], steps: int) -> None:
    """Each prompt's continuation (greedy or seeded sampling, SAMPLINGS in turn) and
    final logits, decoded alone, equal those decoded in batches whose members change
    from step to step, and the logits of a cold prefill of the whole text."""
    samplings = [SAMPLINGS[i % len(SAMPLINGS)] for i in range(len(prompts))]
    alone = [decode_alone(engine, p, steps, sp) for p, sp in zip(prompts, samplings)]
    for prompt, (ids, last) in zip(prompts, alone):
        with engine.new_session() as s:
            s.prefill(prompt + ids)
            assert logits_bits(s) == last, "decoding alone differs from prefilling the same tokens"
    sessions = [engine.new_session() for _ in prompts]
    try:
        got: list[list[int]] = [[] for _ in prompts]
        for s, p, sp in zip(sessions, prompts, samplings):
            s.set_sampling(sp)
            s.prefill(p)
        step = 0
        while any(len(g) < steps for g in got):
            # Members come and go: session i sits out the steps where step % (i + 2) == 1.
            members = [i for i in range(len(prompts)) if len(got[i]) < steps and step % (i + 2) != 1]
            step += 1
            if not members:
                continue
            for i, tok in zip(members, engine.decode_batch([sessions[i] for i in members])):
                got[i].append(tok.id)
        for i, s in enumerate(sessions):
            assert got[i] == alone[i][0], f"prompt {i}: batched decoding chose other tokens"
            s.prefill(got[i][-1:])
            assert logits_bits(s) == alone[i][1], f"prompt {i}: batched decoding changed the logits"
        # The comparison means something: the logits vary over the vocabulary (a 2-bit
        # random model may well repeat one token, so the ids alone cannot show it).
        assert len({alone[0][1][i:i + 4] for i in range(0, len(alone[0][1]), 4)}) > 100
    finally:
        for s in sessions:
            s.close()


def check_warm_resume(engine: Engine, first: list[int], keep: int, rest: list[int]) -> None:
    """Truncating a session to `keep` tokens and prefilling `rest` equals a cold prefill."""
    with engine.new_session() as cold:
        cold.prefill(first[:keep] + rest)
        expected = logits_bits(cold)
        expected_ids = [cold.decode_one().id for _ in range(8)]
    with engine.new_session() as warm:
        warm.prefill(first)
        warm.truncate(keep)
        warm.prefill(rest)
        assert logits_bits(warm) == expected
        assert [warm.decode_one().id for _ in range(8)] == expected_ids


def check_scores(engine: Engine, ids: list[int], split: int) -> None:
    """score() computes many tokens' logits in one forward pass; its log-probabilities
    do not depend on where the scored run starts."""
    with engine.new_session() as whole:
        expected = whole.score(ids, 0)
    with engine.new_session() as s:
        s.prefill(ids[:split])
        assert s.score(ids[split:], 0) == expected[split:]


# ---- tiny models: every architecture and weight format ----------------------------------------

def test_logits_do_not_depend_on_prefill_chunking_or_threads(engines):
    check_chunking_and_threads(engines, sequence(engines[1], 600, seed=1))


def test_decoding_alone_or_batched_with_other_sessions_gives_the_same_logits(engines):
    e = engines[2]
    check_decode_alone_and_batched(e, [sequence(e, n, seed=n) for n in (300, 37, 520, 130)], steps=40)


def test_warm_resume_gives_the_logits_of_a_cold_prefill(engines):
    e = engines[2]
    check_warm_resume(e, sequence(e, 600, seed=2), 333, sequence(e, 210, seed=3))


def test_scores_do_not_depend_on_where_the_scored_run_starts(engines):
    e = engines[2]
    check_scores(e, sequence(e, 400, seed=4), 101)


# ---- the real default model ---------------------------------------------------------------------

def test_default_model_logits_do_not_depend_on_chunking_or_threads(default_engines):
    text = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. " * 30
    check_chunking_and_threads(default_engines, default_engines[1].tokenize(text)[:320])


def test_default_model_decoding_alone_or_batched_gives_the_same_logits(default_engines):
    e = default_engines[2]
    prompts = [e.tokenize(t) for t in ("Once upon a time, " * 40, "List the planets: ", "Dear diary, " * 60)]
    check_decode_alone_and_batched(e, prompts, steps=24)


def test_default_model_warm_resume_gives_the_logits_of_a_cold_prefill(default_engines):
    e = default_engines[2]
    first = e.tokenize("A long conversation about rivers and mills. " * 40)
    check_warm_resume(e, first, 301, e.tokenize(" And then the rain came down on the valley. " * 5))


# ---- through the server (the real default model) -----------------------------------------------

STREAM_TOKENS = 256
TOPICS = ["rivers", "mills", "foxes", "sheep", "bridges", "lighthouses"]
BAN_EOG = {"0": -100, "2": -100}  # SmolLM2's end-of-generation ids: every reply runs to max_tokens


def stream_reply(client: Client, messages: list[dict], session_id: str, max_tokens: int) -> tuple[str, dict]:
    """A greedy streamed chat reply of exactly max_tokens tokens (end-of-generation
    banned): (its text, its usage)."""
    stream = client.chat_stream(messages, session_id=session_id, max_tokens=max_tokens,
                                stream_options={"include_usage": True}, logit_bias=BAN_EOG)
    assert stream.status == 200, stream.body[:300]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in stream.chunks if c["choices"])
    usage = stream.chunks[-1]["usage"]
    assert usage["completion_tokens"] == max_tokens
    return text, usage


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_concurrent_streams_are_byte_identical_to_their_solo_runs(kv_type):
    with running_llmd("--max-sessions", "8", "--ctx", "1024", "--kv-type", kv_type) as url:
        client = Client(url + "/v1", model=MODEL)
        prompts = [[{"role": "user", "content": f"Write a long story about {t}."}] for t in TOPICS]
        solo = []
        for i, p in enumerate(prompts):
            solo.append(stream_reply(client, p, f"solo-{i}", STREAM_TOKENS)[0])
            assert client.request("DELETE", f"/sessions/solo-{i}").status == 200  # a free slot for each stream
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda i: stream_reply(client, prompts[i], f"together-{i}", STREAM_TOKENS)[0],
                                     range(len(prompts))))
    for i, (a, b) in enumerate(zip(solo, together)):
        assert a == b, f"stream {i} diverged at character {next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)}"
    assert len(set(solo)) == len(solo)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_a_warm_resumed_turn_is_byte_identical_to_the_same_turn_computed_cold(kv_type):
    """The second turn resumes after the first; resubmitted, it reuses all but its last
    prompt token, so a one-token prefill precedes its reply."""
    system = {"role": "system", "content": "You are a patient teacher. " * 12}
    runs = {}
    for mode, flags in (("warm", ()), ("cold", ("--no-warm-resume",))):
        with running_llmd("--max-sessions", "4", "--ctx", "1024", "--kv-type", kv_type, *flags) as url:
            client = Client(url + "/v1", model=MODEL)
            history = [system, {"role": "user", "content": "Explain how a water mill works."}]
            first, _ = stream_reply(client, history, "conversation", 96)
            history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And a windmill?"}]
            second, usage = stream_reply(client, history, "conversation", 128)
            again, again_usage = stream_reply(client, history, "conversation", 128)
            runs[mode] = (first, second, again)
            cached = (usage["prompt_tokens_details"]["cached_tokens"], again_usage["prompt_tokens_details"]["cached_tokens"])
            if mode == "warm":
                assert cached[0] > 100 and cached[1] == usage["prompt_tokens"] - 1
            else:
                assert cached == (0, 0)
    assert runs["warm"] == runs["cold"]
