"""A session's state as bytes (native/src/memory/session_state.cpp through llmd.h's
llmd_session_export / llmd_session_import): a restored session continues exactly as
the saved one and as a fresh prefill would, sliding-window rings and the recurrent
state of hybrid models (with its checkpoints) included, and bytes that do not fit the
engine are refused with the session left unchanged."""
from __future__ import annotations

import random
import struct
from functools import partial

import pytest

from llmd._native import lib
from llmd.engine.native import Engine, EngineError
from tests.llama_archs import writer_model
from tests.support.gguf_writer import (
    build_tiny_gemma3, build_tiny_gpt_oss, build_tiny_granitehybrid, build_tiny_lfm2, build_tiny_qwen35,
)

# The hybrid families, each a builder of a tiny model taking n_ctx.
HYBRIDS = {"qwen35": build_tiny_qwen35, "qwen35moe": partial(build_tiny_qwen35, n_expert=8), "lfm2": build_tiny_lfm2,
           "lfm2moe": partial(writer_model, "lfm2moe-moe"),
           "granitehybrid": partial(build_tiny_granitehybrid, n_expert=4, rope=False)}

# magic, version, n_layer, n_head_kv, head_dim, n_ctx, k_type, v_type, n_tokens, high
HEADER = struct.Struct("<9Ii")


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(str(tiny_model.path), n_threads=2, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module", params=[(build, kv) for build in ("gemma3", "gpt-oss") for kv in ("f16", "q8_0")],
                ids=lambda p: "-".join(p))
def windowed_engine(request, tmp_path_factory):
    """Sliding-window layers of 32 positions whose rings (288 slots) wrap well before
    the context's end, in a tiny gemma3 and a tiny gpt-oss (attention sinks); the KV
    cache in f16 and in q8_0."""
    name, kv = request.param
    build = build_tiny_gemma3 if name == "gemma3" else build_tiny_gpt_oss
    path = build(n_ctx=1024, window=32).write(tmp_path_factory.mktemp("state") / f"{name}.gguf")
    with Engine(str(path), n_threads=2, n_ctx=1024, max_sessions=4, kv_type_k=kv, kv_type_v=kv) as e:
        yield e


# KV types (keys, values) of a cache, quantized ones included.
KV_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")]
GGML = {"f16": 1, "q8_0": 8, "q4_0": 2}
ROW_BYTES = {"f16": lambda hd: 2 * hd, "q8_0": lambda hd: hd // 32 * 34, "q4_0": lambda hd: hd // 32 * 18}


@pytest.fixture(scope="module")
def wide_heads(tiny_llama_factory):
    """A tiny llama with heads of 32, which quantized KV types take."""
    return tiny_llama_factory(n_embd=128, n_head=4, n_head_kv=2)


def ids(n: int, n_vocab: int, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(n_vocab) for _ in range(n)]


def restored_copy(engine: Engine, source):
    """A new session holding source's exported state."""
    target = engine.new_session()
    target.import_state(source.export_state())
    return target


def test_restored_session_holds_the_same_ids_and_continues_bit_identically(engine):
    prompt, more = ids(100, engine.info.n_vocab), ids(9, engine.info.n_vocab, seed=8)
    with engine.new_session() as saved:
        saved.prefill(prompt)
        with restored_copy(engine, saved) as restored:
            assert restored.tokens() == prompt and restored.position == 100
            saved.prefill(more)
            restored.prefill(more)
            assert restored.logits() == saved.logits()


def test_restored_prefix_continues_exactly_as_a_fresh_prefill(engine):
    prompt = ids(120, engine.info.n_vocab)
    with engine.new_session() as saved, engine.new_session() as fresh:
        saved.prefill(prompt[:70])
        fresh.prefill(prompt)
        with restored_copy(engine, saved) as restored:
            restored.prefill(prompt[70:])
            assert restored.logits() == fresh.logits()
            greedy = [restored.decode_one().id for _ in range(8)]
            assert greedy == [fresh.decode_one().id for _ in range(8)]


def test_a_prefix_exports_as_if_the_session_were_truncated_to_it_and_the_session_is_unchanged(engine):
    prompt = ids(60, engine.info.n_vocab)
    with engine.new_session() as s, engine.new_session() as cut:
        s.prefill(prompt)
        before = s.logits()
        prefix = s.export_state(40)
        assert s.tokens() == prompt and s.logits() == before
        cut.prefill(prompt)
        cut.truncate(40)
        assert bytes(prefix) == bytes(cut.export_state())
        with pytest.raises(EngineError, match="n_tokens 61 is outside 0..60"):
            s.export_state(61)
        with pytest.raises(EngineError, match="outside"):
            s.export_state(-1)


def test_an_empty_session_exports_and_imports_as_empty(engine):
    with engine.new_session() as empty, engine.new_session() as target:
        target.prefill(ids(5, engine.info.n_vocab))
        target.import_state(empty.export_state())
        assert target.position == 0 and target.tokens() == []


def test_export_covers_only_the_ids_in_the_cache_not_a_pending_token(engine):
    prompt = ids(20, engine.info.n_vocab)
    with engine.new_session() as s:
        s.prefill(prompt)
        s.decode_one()  # sampled, pending: not in the cache yet
        with restored_copy(engine, s) as restored:
            assert restored.tokens() == prompt


def test_state_bytes_follow_the_documented_layout(engine, tiny_model):
    with engine.new_session() as s:
        s.prefill(ids(10, engine.info.n_vocab))
        state = bytes(s.export_state())
    magic, version, n_layer, n_head_kv, head_dim, n_ctx, k_type, v_type, n_tokens, high = HEADER.unpack_from(state)
    assert magic.to_bytes(4, "little") == b"LKVS" and version == 3 and (k_type, v_type) == (1, 1)
    assert (n_layer, n_head_kv, n_ctx, n_tokens, high) == (tiny_model.n_layer, tiny_model.n_head_kv, 128, 10, 9)
    assert head_dim == tiny_model.n_embd // tiny_model.n_head
    # header, ids, then per layer its first position and K and V rows of f16, then the
    # recurrent section: no floats, no checkpoints
    rows = n_head_kv * n_tokens * head_dim * 2
    assert len(state) == HEADER.size + 4 * n_tokens + n_layer * (4 + 2 * rows) + 8
    assert state[-8:] == b"\0" * 8


def corruptions(state: bytes) -> dict[str, bytes]:
    def patched(offset: int, value: int, fmt: str = "<I") -> bytes:
        b = bytearray(state)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    return {
        "truncated": state[:-1],
        "padded": state + b"\0",
        "header_only": state[:HEADER.size - 1],
        "empty": b"",
        "bad_magic": patched(0, 0x12345678),
        "older_version": patched(4, 2),
        "newer_version": patched(4, 4),
        "other_n_layer": patched(8, 3),
        "other_n_ctx": patched(20, 256),
        "other_key_type": patched(24, 8),
        "unknown_value_type": patched(28, 99),
        "more_tokens_than_context": patched(32, 129),
        "impossible_high": patched(36, 3, "<i"),
        "token_outside_vocabulary": patched(HEADER.size, 100000, "<i"),
        "negative_token": patched(HEADER.size, -1, "<i"),
        "layer_first_position": patched(HEADER.size + 4 * 10, 1),
    }


@pytest.mark.parametrize("name", list(corruptions(b"\0" * 200)))
def test_bytes_that_do_not_fit_are_refused_and_the_session_is_unchanged(engine, name):
    prompt, other = ids(10, engine.info.n_vocab), ids(4, engine.info.n_vocab, seed=9)
    with engine.new_session() as s, engine.new_session() as target:
        s.prefill(prompt)
        bad = corruptions(bytes(s.export_state()))[name]
        target.prefill(other)
        before = target.logits()
        with pytest.raises(EngineError) as refused:
            target.import_state(bad)
        assert refused.value.status == lib.LLMD_ERR_FORMAT
        assert str(refused.value).startswith("session state: ")
        assert target.tokens() == other and target.logits() == before


def test_state_of_another_context_is_refused(tiny_model, engine):
    with Engine(str(tiny_model.path), n_threads=1, n_ctx=64, max_sessions=2) as small:
        with small.new_session() as s, engine.new_session() as target:
            s.prefill(ids(10, small.info.n_vocab))
            with pytest.raises(EngineError, match="n_ctx 64 does not match this engine's 128"):
                target.import_state(s.export_state())


@pytest.mark.parametrize("kv", KV_PAIRS, ids=["/".join(p) for p in KV_PAIRS])
def test_a_cache_of_each_kv_type_restores_as_its_rows_and_continues_as_a_fresh_prefill(wide_heads, kv):
    """The state holds each position's key and value as rows of the cache's types (the
    quantized bytes themselves: nothing is requantized), so a restored session
    continues bit-identically to a fresh prefill with the same KV types."""
    with Engine(str(wide_heads.path), n_threads=2, max_sessions=4, kv_type_k=kv[0], kv_type_v=kv[1]) as engine:
        prompt = ids(120, engine.info.n_vocab)
        with engine.new_session() as saved, engine.new_session() as fresh:
            saved.prefill(prompt[:70])
            fresh.prefill(prompt)
            state = bytes(saved.export_state())
            with restored_copy(engine, saved) as restored:
                restored.prefill(prompt[70:])
                assert restored.logits() == fresh.logits()
                assert [restored.decode_one().id for _ in range(8)] == [fresh.decode_one().id for _ in range(8)]
    *_, k_type, v_type, n_tokens, _ = HEADER.unpack_from(state)
    assert (k_type, v_type, n_tokens) == (GGML[kv[0]], GGML[kv[1]], 70)
    rows = wide_heads.n_head_kv * n_tokens
    hd = 32
    per_layer = 4 + rows * (ROW_BYTES[kv[0]](hd) + ROW_BYTES[kv[1]](hd))
    assert len(state) == HEADER.size + 4 * n_tokens + wide_heads.n_layer * per_layer + 8


def test_state_of_other_kv_types_is_refused_with_the_reason(wide_heads):
    """A quantized row cannot become the f16 row a prefill computes (nor the other way
    round): the state is refused, never converted or misread."""
    path = str(wide_heads.path)
    with Engine(path, n_threads=1, max_sessions=2, kv_type_k="q8_0", kv_type_v="q8_0") as q8, \
            Engine(path, n_threads=1, max_sessions=2) as f16, \
            Engine(path, n_threads=1, max_sessions=2, kv_type_k="q8_0", kv_type_v="f16") as mixed:
        with q8.new_session() as s, f16.new_session() as target, mixed.new_session() as other:
            s.prefill(ids(10, q8.info.n_vocab))
            state = s.export_state()
            with pytest.raises(EngineError, match="keys stored as q8_0, this engine's cache keeps f16"):
                target.import_state(state)
            with pytest.raises(EngineError, match="values stored as q8_0, this engine's cache keeps f16"):
                other.import_state(state)
            assert target.position == 0 and other.position == 0


def test_sliding_window_rings_resume_exactly_after_they_wrapped(windowed_engine):
    engine = windowed_engine
    prompt, more = ids(700, engine.info.n_vocab), ids(5, engine.info.n_vocab, seed=3)
    with engine.new_session() as saved:
        saved.prefill(prompt[:300])
        saved.prefill(prompt[300:])
        with restored_copy(engine, saved) as restored:
            assert restored.resume_floor == saved.resume_floor > 0
            saved.prefill(more)
            restored.prefill(more)
            assert restored.logits() == saved.logits()
            # the ring kept what a truncate back to the floor needs, as the original did
            floor = restored.resume_floor
            for s in (saved, restored):
                s.truncate(floor)
                s.prefill(more)
            assert restored.logits() == saved.logits()


def test_a_ring_prefix_before_the_resume_floor_is_refused(windowed_engine):
    engine = windowed_engine
    with engine.new_session() as s:
        s.prefill(ids(700, engine.info.n_vocab))
        floor = s.resume_floor
        with pytest.raises(EngineError, match=f"n_tokens {floor - 1} is before {floor}"):
            s.export_state(floor - 1)
        assert len(bytes(s.export_state(0))) == HEADER.size + engine.info.n_layer * 4 + 8  # + no recurrent state


def test_a_ring_truncated_below_its_high_water_mark_saves_only_what_it_holds(windowed_engine):
    engine = windowed_engine
    prompt, more = ids(800, engine.info.n_vocab), ids(6, engine.info.n_vocab, seed=4)
    with engine.new_session() as saved, engine.new_session() as fresh:
        saved.prefill(prompt)
        saved.truncate(780)  # the ring still holds positions written up to 799
        with restored_copy(engine, saved) as restored:
            assert restored.resume_floor == saved.resume_floor
            restored.prefill(more)
            fresh.prefill(prompt[:780] + more)
            assert restored.logits() == fresh.logits()


def test_file_layout_points_at_the_tensor_data(tiny_model, engine):
    header, size = engine.file_layout()
    data = tiny_model.path.read_bytes()
    assert size == len(data) and 0 < header < size and header % 32 == 0
    assert data[:4] == b"GGUF"


# ---- hybrid models: the recurrent state and its checkpoints ----------------------------------

@pytest.fixture(scope="module", params=list(HYBRIDS))
def hybrid(request, tmp_path_factory):
    build = HYBRIDS[request.param]
    path = build(n_ctx=256).write(tmp_path_factory.mktemp("state") / f"{request.param}.gguf")
    with Engine(str(path), n_threads=2, n_ctx=256, max_sessions=4) as e:
        yield e


def greedy(session, n: int = 8) -> list[int]:
    return [session.decode_one().id for _ in range(n)]


def test_a_restored_hybrid_session_continues_bit_identically_to_one_that_never_left(hybrid):
    prompt, more = ids(90, hybrid.info.n_vocab), ids(7, hybrid.info.n_vocab, seed=8)
    with hybrid.new_session() as saved:
        saved.prefill(prompt[:40])
        saved.prefill(prompt[40:])
        with restored_copy(hybrid, saved) as restored:
            assert restored.tokens() == prompt and saved.checkpoints == [40, 90]
            assert restored.checkpoints == [40]  # the newest before its position (the next prefill takes 90)
            saved.prefill(more)
            restored.prefill(more)
            assert restored.logits() == saved.logits()
            assert greedy(restored) == greedy(saved)


def test_a_restored_hybrid_session_rewinds_to_its_saved_checkpoints_exactly(hybrid):
    prompt, other = ids(90, hybrid.info.n_vocab), ids(12, hybrid.info.n_vocab, seed=9)
    with hybrid.new_session() as saved, hybrid.new_session() as fresh:
        saved.prefill(prompt[:40])
        saved.prefill(prompt[40:])
        fresh.prefill(prompt[:40] + other)
        with restored_copy(hybrid, saved) as restored:
            restored.truncate(40)  # a checkpoint the file carried
            restored.prefill(other)
            assert restored.logits() == fresh.logits()


def test_a_hybrid_prefix_exports_only_at_a_checkpoint_and_as_if_truncated_to_it(hybrid):
    prompt = ids(90, hybrid.info.n_vocab)
    with hybrid.new_session() as s, hybrid.new_session() as cut:
        for piece in (prompt[:30], prompt[30:60], prompt[60:]):
            s.prefill(piece)
            cut.prefill(piece)
        cut.truncate(60)
        assert bytes(s.export_state(60)) == bytes(cut.export_state())
        with restored_copy(hybrid, s) as restored:
            assert restored.checkpoints == [60]  # older ones are not saved
        assert s.position == 90 and s.checkpoints == [30, 60, 90]
        with pytest.raises(EngineError, match="n_tokens 50 is not a checkpoint") as err:
            s.export_state(50)
        assert err.value.status == lib.LLMD_ERR_STATE


def test_a_hybrid_session_warm_from_a_checkpoint_decodes_as_a_full_reprefill(hybrid):
    prompt = ids(70, hybrid.info.n_vocab)
    with hybrid.new_session() as warm, hybrid.new_session() as cold:
        warm.prefill(prompt[:30])
        warm.prefill(prompt[30:60])
        greedy(warm, 5)
        warm.truncate(30)  # back past the reply and the second prompt
        assert warm.position == 30 and warm.checkpoints == [30]
        warm.prefill(prompt[30:])
        cold.prefill(prompt)
        assert warm.logits() == cold.logits()
        assert greedy(warm) == greedy(cold)


def test_truncating_a_hybrid_session_to_zero_forgets_its_state_and_checkpoints(hybrid):
    prompt = ids(20, hybrid.info.n_vocab, seed=9)
    with hybrid.new_session() as s, hybrid.new_session() as fresh:
        s.prefill(ids(40, hybrid.info.n_vocab))
        s.truncate(0)
        assert s.checkpoints == [] and s.position == 0
        s.prefill(prompt)
        fresh.prefill(prompt)
        assert s.logits() == fresh.logits()


def test_an_empty_hybrid_session_restores_a_zero_state(hybrid):
    prompt = ids(20, hybrid.info.n_vocab)
    with hybrid.new_session() as empty, hybrid.new_session() as target, hybrid.new_session() as fresh:
        target.prefill(ids(30, hybrid.info.n_vocab, seed=5))
        target.import_state(empty.export_state())
        assert target.position == 0 and target.checkpoints == []
        target.prefill(prompt)
        fresh.prefill(prompt)
        assert target.logits() == fresh.logits()


def hybrid_corruptions(state: bytes, floats: int, count: int) -> dict[str, bytes]:
    """Damaged copies of a state whose recurrent section (at its end) holds states of
    `floats` floats and `count` checkpoints."""
    at = len(state) - 8 - floats * 4 - count * (4 + floats * 4)
    assert struct.unpack_from("<II", state, at) == (floats, count)

    def patched(offset: int, value: int, fmt: str = "<I") -> bytes:
        b = bytearray(state)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    first_point = at + 8 + floats * 4
    return {
        "truncated_state": state[:-4],
        "fewer_floats": patched(at, floats - 1),
        "more_checkpoints_than_kept": patched(at + 4, 9),
        "checkpoint_past_the_tokens": patched(first_point, 91, "<i"),
        "checkpoint_at_zero": patched(first_point, 0, "<i"),
        "no_recurrent_section": state[:at],
    }


HYBRID_CORRUPTIONS = ["truncated_state", "fewer_floats", "more_checkpoints_than_kept", "checkpoint_past_the_tokens",
                      "checkpoint_at_zero", "no_recurrent_section"]


@pytest.mark.parametrize("name", HYBRID_CORRUPTIONS)
def test_a_damaged_recurrent_section_is_refused_and_the_session_is_unchanged(hybrid, name):
    prompt, other = ids(90, hybrid.info.n_vocab), ids(4, hybrid.info.n_vocab, seed=9)
    with hybrid.new_session() as s, hybrid.new_session() as target:
        s.prefill(prompt[:30])
        s.prefill(prompt[30:60])
        s.prefill(prompt[60:])
        floats = hybrid.info.recurrent_bytes // 4 // 11  # the state, room for 8 checkpoints and a trail of 2
        bad = hybrid_corruptions(bytes(s.export_state()), floats, 1)[name]  # the checkpoint at 60
        target.prefill(other)
        before, points = target.logits(), target.checkpoints
        with pytest.raises(EngineError) as refused:
            target.import_state(bad)
        assert refused.value.status == lib.LLMD_ERR_FORMAT
        assert str(refused.value).startswith("session state: ")
        assert target.tokens() == other and target.logits() == before and target.checkpoints == points


def test_state_of_a_model_without_recurrent_layers_is_refused_by_a_hybrid_one(engine, tmp_path):
    path = build_tiny_qwen35(n_ctx=128).write(tmp_path / "q.gguf")
    with Engine(str(path), n_threads=1, n_ctx=128, max_sessions=2) as hybrid, engine.new_session() as s:
        s.prefill(ids(10, engine.info.n_vocab))
        with hybrid.new_session() as target, pytest.raises(EngineError) as refused:
            target.import_state(s.export_state())
        assert refused.value.status == lib.LLMD_ERR_FORMAT
