"""The engine's paged KV memory and prefix cache (native/src/memory/kvpool.h): blocks shared
between sessions of one scope, reference counts, copy on write, retired blocks under
their budget, the recurrent snapshots of hybrid models (recurrent.h: SnapshotCache),
and outputs equal to a fresh prefill's. Tiny random-weight models."""
import random
from functools import partial

import pytest

from llmd.engine.native import Engine, EngineError, Sampling
from tests.llama_archs import writer_model
from tests.support.gguf_writer import (
    build_tiny_gemma3, build_tiny_gpt_oss, build_tiny_granitehybrid, build_tiny_lfm2, build_tiny_qwen35,
)

# The hybrid families, each a builder of a tiny model taking n_ctx.
HYBRIDS = {"qwen35": build_tiny_qwen35, "qwen35moe": partial(build_tiny_qwen35, n_expert=8), "lfm2": build_tiny_lfm2,
           "lfm2moe": partial(writer_model, "lfm2moe-moe"),
           "granitehybrid": partial(build_tiny_granitehybrid, n_expert=4, rope=False)}

BLOCK = 64  # positions per block (kKVBlock)


@pytest.fixture(scope="module")
def model(tiny_llama_factory):
    return tiny_llama_factory(n_ctx=1024, n_embd=128, n_head=4, n_head_kv=2)  # heads of 32: any KV type


@pytest.fixture(params=["f16", "q8_0", "q4_0"])
def engine(request, model):
    """The engine, its KV cache of each type: the prefix cache shares quantized blocks
    as it shares f16 ones."""
    with Engine(model.path, n_threads=2, max_sessions=8, kv_type_k=request.param, kv_type_v=request.param) as e:
        yield e


def prompt(n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 250) for _ in range(n)]


def greedy(session, n: int = 12) -> list[int]:
    session.set_sampling(Sampling())
    return [session.decode_one().id for _ in range(n)]


def fresh(engine: Engine, ids: list[int]) -> tuple[list[float], list[int]]:
    """Logits after ids and the greedy continuation, from a session that prefilled them all."""
    with engine.new_session() as s:
        s.prefill(ids)
        return s.logits(), greedy(s)


def joined(engine: Engine, scope: str, ids: list[int]):
    """A new session in `scope` that has prefilled ids."""
    s = engine.new_session()
    reused = s.share_prefix(scope, ids, 0)
    s.prefill(ids[reused:])
    return s


def test_the_engine_reports_its_blocks(engine):
    info = engine.info
    assert info.kv_block_positions == BLOCK
    assert info.kv_block_bytes == BLOCK * info.kv_bytes_per_token
    assert info.kv_shares_prefixes
    assert engine.kv_stats().blocks_live == 0


def test_blocks_are_allocated_as_positions_are_written(engine):
    with engine.new_session() as s:
        assert engine.kv_stats().blocks_live == 0
        s.prefill(prompt(1))
        assert engine.kv_stats().blocks_live == 1
        s.prefill(prompt(BLOCK))
        assert engine.kv_stats().blocks_live == 2
        s.truncate(BLOCK)
        assert engine.kv_stats().blocks_live == 1
    assert engine.kv_stats().blocks_live == 0


def test_a_cached_prefix_gives_the_logits_and_tokens_of_a_fresh_prefill(engine):
    ids = prompt(300)
    a = joined(engine, "", ids)
    b = engine.new_session()
    assert b.share_prefix("", ids, 0) == 299  # four shared blocks and 43 positions copied from a's fifth
    b.prefill(ids[299:])
    assert (b.logits(), greedy(b)) == fresh(engine, ids)
    a.close()
    b.close()


def test_blocks_filled_while_decoding_are_shared_exactly(engine):
    a = joined(engine, "", prompt(60))
    generated = greedy(a, 10)  # positions 60..68 enter the cache while decoding
    ids = prompt(60) + generated[:9] + prompt(5, seed=2)
    b = engine.new_session()
    assert b.share_prefix("", ids, 0) == 69
    b.prefill(ids[69:])
    assert (b.logits(), greedy(b)) == fresh(engine, ids)
    a.close()
    b.close()


def test_sessions_sharing_a_prompt_store_its_blocks_once(engine):
    system = prompt(4 * BLOCK)
    sessions = [joined(engine, "", system + prompt(10, seed=10 + i)) for i in range(4)]
    stats = engine.kv_stats()
    assert stats.blocks_live == 4 + 4          # the prompt's blocks once, a tail block each
    assert stats.block_refs == 4 * 5
    for s in sessions:
        s.close()
    assert engine.kv_stats().blocks_live == 0
    assert engine.kv_stats().block_refs == 0


def test_another_scope_never_reuses_the_prefix(engine):
    ids = prompt(200)
    a = joined(engine, "key-a", ids)
    with engine.new_session() as b:
        assert b.share_prefix("key-b", ids, 0) == 0
        assert b.position == 0
    with engine.new_session() as c:
        assert c.share_prefix("key-a", ids, 0) == 199
    a.close()


def test_a_longer_own_cache_is_kept(engine):
    ids = prompt(200)
    a = joined(engine, "", ids[:100])
    with engine.new_session() as b:
        b.share_prefix("", ids[:150], 0)
        b.prefill(ids[100:150])
        assert b.share_prefix("", ids, 150) == 0  # nothing longer than its own 150
        assert b.position == 150
    a.close()


def test_a_cache_that_served_another_scope_neither_lends_nor_publishes(engine):
    ids = prompt(200)
    with engine.new_session() as s:
        s.prefill(ids)  # computed before it joined any scope
        assert s.share_prefix("key-b", ids + [1], 200) == 0  # kept by its owner, as its own cache
        s.prefill([1])
        with engine.new_session() as other:
            assert other.share_prefix("key-b", ids + [1, 2], 0) == 0
        s.truncate(0)  # emptied: what it computes from now on is key-b's
        s.prefill(ids)
        with engine.new_session() as other:
            assert other.share_prefix("key-b", ids, 0) == 199


def test_writing_into_a_shared_block_copies_it(engine):
    ids = prompt(200)
    a = joined(engine, "", ids)
    b = engine.new_session()
    assert b.share_prefix("", ids, 0) == 199
    a.truncate(100)  # inside the second block, which b holds too
    a.prefill(prompt(80, seed=3))
    b.prefill(ids[199:])
    assert (b.logits(), greedy(b)) == fresh(engine, ids)
    assert (a.logits(), greedy(a)) == fresh(engine, ids[:100] + prompt(80, seed=3))
    a.close()
    b.close()
    assert engine.kv_stats().blocks_live == 0


def test_retired_blocks_serve_later_sessions(engine):
    ids = prompt(5 * BLOCK + 7)
    joined(engine, "", ids).close()
    stats = engine.kv_stats()
    assert (stats.blocks_live, stats.blocks_retired) == (0, 5)  # full blocks kept, the partial one freed
    with engine.new_session() as b:
        assert b.share_prefix("", ids, 0) == 5 * BLOCK
        b.prefill(ids[5 * BLOCK:])
        assert (b.logits(), greedy(b)) == fresh(engine, ids)


def test_retired_blocks_beyond_the_budget_are_evicted_least_recent_first(model):
    with Engine(model.path, n_threads=2, max_sessions=4) as probe:
        block_bytes = probe.info.kv_block_bytes
    with Engine(model.path, n_threads=2, max_sessions=4, prefix_cache_bytes=2 * block_bytes) as engine:
        ids = prompt(5 * BLOCK + 1)
        joined(engine, "", ids).close()
        assert engine.kv_stats().blocks_retired == 2
        # Released last block first, so the prompt's first two blocks are the ones kept.
        with engine.new_session() as b:
            assert b.share_prefix("", ids, 0) == 2 * BLOCK
        other = prompt(3 * BLOCK + 1, seed=9)
        joined(engine, "", other).close()
        assert engine.kv_stats().blocks_retired == 2
        with engine.new_session() as c:
            assert c.share_prefix("", ids, 0) == 0  # pushed out by the newer prompt's blocks
            assert c.share_prefix("", other, 0) == 2 * BLOCK


def test_sessions_growing_side_by_side_compute_what_one_alone_does(model):
    """A context of 256 makes slabs of 4 blocks (kvpool.h: placement): three sessions
    that take turns to grow interleave their blocks, cross slabs and land in the middle
    of free runs, so attention reads their blocks apart where a lone session's lie in a
    row. Neither changes a bit; the emptied slabs are freed and come back."""
    with Engine(model.path, n_threads=2, max_sessions=4, n_ctx=256) as engine:
        texts = [prompt(230, seed=20 + i) for i in range(3)]
        alone = [fresh(engine, ids) for ids in texts]
        for _ in range(2):
            sessions = [engine.new_session() for _ in texts]
            for start in range(0, 230, 50):
                for s, ids in zip(sessions, texts):
                    s.prefill(ids[start:start + 50])
            assert [(s.logits(), greedy(s)) for s in sessions] == alone
            for s in sessions:
                s.close()
            assert engine.kv_stats().blocks_live == 0


def test_share_prefix_refuses_bad_arguments(engine, model):
    with engine.new_session() as s:
        with pytest.raises(EngineError):
            s.share_prefix("", [], 0)
        with pytest.raises(EngineError):
            s.share_prefix("", [1, 2, 3], -1)
        with pytest.raises(EngineError, match="outside the vocabulary"):
            s.share_prefix("", [1, model.n_vocab], 0)
        assert s.position == 0


# Models with sliding-window layers, each a builder taking n_ctx and window: a tiny gemma3
# (five of six layers keep a ring of 288 slots for their 32-position window, plus a
# prefill chunk; the sixth attends everything from pool blocks) and a tiny gpt-oss (its
# even layers in rings, its odd ones global, attention sinks in all).
WINDOWED = {"gemma3": build_tiny_gemma3, "gpt-oss": build_tiny_gpt_oss}


@pytest.fixture(scope="module", params=list(WINDOWED))
def windowed(request, tmp_path_factory):
    path = WINDOWED[request.param](n_ctx=1024, window=32).write(
        tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf")
    with Engine(path, n_threads=2, max_sessions=6) as e:
        yield e


def other_than(token: int) -> int:
    return (token + 1) % 250


def test_a_model_with_sliding_window_rings_shares_a_prefix_that_a_live_session_still_holds(windowed):
    assert windowed.info.kv_shares_prefixes
    ids = prompt(500)
    a = joined(windowed, "t1", ids)
    greedy(a, 20)  # a moves on, its rings still holding the window before position 500
    b_ids = ids + [other_than(a.tokens()[500])]
    b = joined(windowed, "t1", prompt(700, seed=9))  # rings full of another prompt
    assert b.share_prefix("t1", b_ids, 0) == 500  # longer than a ring: blocks, and a's rings' window copied
    b.prefill(b_ids[500:])
    assert (b.logits(), greedy(b)) == fresh(windowed, b_ids)
    # Its rings start where the copy did, not where rings of 501 written positions
    # would: cut back to its resume floor, it still computes what a fresh prefill does.
    b.truncate(500)
    floor = b.resume_floor
    assert 0 < floor < 500
    b.truncate(floor)
    b.prefill(b_ids[floor:floor + 1])
    assert b.logits() == fresh(windowed, b_ids[:floor + 1])[0]
    a.close()
    b.close()
    assert windowed.kv_stats().blocks_live == 0


def test_a_prefix_that_no_live_ring_holds_any_more_is_prefilled(windowed):
    ids = prompt(300)
    a = joined(windowed, "t2", ids + prompt(400, seed=2))  # a's rings moved 400 positions past the shared 300
    assert a.resume_floor > 300
    with windowed.new_session() as b:
        b_ids = ids + [other_than(a.tokens()[300])]
        assert b.share_prefix("t2", b_ids, 0) == 0
        b.prefill(b_ids)
        assert (b.logits(), greedy(b)) == fresh(windowed, b_ids)
    a.close()


def test_a_prefix_with_copied_rings_saves_and_restores_exactly(windowed):
    ids = prompt(450, seed=3)
    a = joined(windowed, "t3", ids)
    greedy(a, 3)
    b_ids = ids + [other_than(a.tokens()[450]), 7]
    b = windowed.new_session()
    assert b.share_prefix("t3", b_ids, 0) == 450
    b.prefill(b_ids[450:])
    state, floor = bytes(b.export_state()), b.resume_floor
    expected = (b.logits(), greedy(b))
    with windowed.new_session() as c:
        c.import_state(state)
        assert c.resume_floor == floor > 0  # the rings start where b's copy did
        c.truncate(len(b_ids) - 1)
        c.prefill(b_ids[-1:])
        assert (c.logits(), greedy(c)) == expected
    a.close()
    b.close()


# ---- hybrid models: the recurrent state at a block boundary -------------------------------

SNAPSHOTS = 8  # kSnapshots: the engine's budget of recurrent snapshots, in states


@pytest.fixture(scope="module", params=list(HYBRIDS))
def hybrid_model(request, tmp_path_factory):
    build = HYBRIDS[request.param]
    return build(n_ctx=512).write(tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf")


@pytest.fixture
def hybrid(hybrid_model):
    with Engine(str(hybrid_model), n_threads=2, n_ctx=512, max_sessions=8) as e:
        yield e


def state_bytes(engine: Engine) -> int:
    return engine.info.recurrent_bytes // 11  # the live state, room for 8 checkpoints and a trail of 2


def test_a_hybrid_engine_shares_prefixes_and_counts_its_snapshots_in_capacity(hybrid):
    info, stats = hybrid.info, hybrid.kv_stats()
    assert info.kv_shares_prefixes
    assert (stats.snapshots, stats.snapshot_bytes, stats.snapshot_budget) == (0, 0, SNAPSHOTS * state_bytes(hybrid))
    per = info.bytes_per_session
    assert hybrid.capacity(2 * per + stats.snapshot_budget)[0] == 2
    assert hybrid.capacity(2 * per + stats.snapshot_budget - 1)[0] == 1


def test_a_hybrid_prefix_resumes_at_the_last_block_boundary_of_a_prefill_exactly(hybrid):
    ids = prompt(150)
    joined(hybrid, "", ids).close()  # its blocks retire, its snapshot stays
    stats = hybrid.kv_stats()
    assert (stats.snapshots, stats.snapshot_bytes) == (1, state_bytes(hybrid))  # at 128, not at 64
    longer = ids + prompt(20, seed=2)
    with hybrid.new_session() as b:
        assert b.share_prefix("", longer, 0) == 2 * BLOCK  # whole blocks only: no tail without a state
        assert b.checkpoints == [] and b.position == 2 * BLOCK
        b.prefill(longer[2 * BLOCK:])
        assert (b.logits(), greedy(b)) == fresh(hybrid, longer)


def test_a_hybrid_prefix_without_a_snapshot_at_its_end_is_not_shared(hybrid):
    a = joined(hybrid, "", prompt(150))
    with hybrid.new_session() as b:  # the blocks of 0..64 match, but no state was kept at 64
        assert b.share_prefix("", prompt(100), 0) == 0
        assert b.position == 0
    a.close()


def test_a_reply_leaves_the_state_at_its_newest_block_boundary_exactly(hybrid):
    a = joined(hybrid, "", prompt(60))  # no boundary in the prompt: no snapshot
    assert hybrid.kv_stats().snapshots == 0
    generated = greedy(a, 140)  # positions 60..198 enter the cache: boundaries 64, 128, 192
    assert hybrid.kv_stats().snapshots == 1  # each replaced the one before it
    a.close()
    ids = prompt(60) + generated[:139] + prompt(5, seed=2)
    with hybrid.new_session() as b:
        assert b.share_prefix("", ids, 0) == 3 * BLOCK
        b.prefill(ids[3 * BLOCK:])
        assert (b.logits(), greedy(b)) == fresh(hybrid, ids)


def test_a_live_hybrid_session_lends_its_state_where_it_stands_and_at_its_checkpoints(hybrid):
    a = joined(hybrid, "", prompt(100))
    generated = greedy(a, 10)  # a stands at 109; a checkpoint at 100
    for ids, lent in ((prompt(100) + generated[:9] + [7], 109),  # where it stands: no block boundary
                      (prompt(100) + prompt(5, seed=2), 100)):   # its checkpoint where the prompt ended
        with hybrid.new_session() as b:
            assert b.share_prefix("", ids, 0) == lent
            b.prefill(ids[lent:])
            assert (b.logits(), greedy(b)) == fresh(hybrid, ids)
    assert a.position == 109 and a.checkpoints == [100]  # the lender is unchanged
    a.close()


def test_a_hybrid_session_resumes_from_its_own_state_through_the_prefix_cache(hybrid):
    ids = prompt(100)
    with hybrid.new_session() as s:  # as the scratch session serves anonymous requests
        s.share_prefix("", ids, 0)
        s.prefill(ids)
        greedy(s, 5)  # s stands at 104
        longer = ids + prompt(30, seed=3)
        assert s.share_prefix("", longer, 0) == 100  # its checkpoint at the prompt's end
        s.prefill(longer[100:])
        assert (s.logits(), greedy(s)) == fresh(hybrid, longer)


def test_another_scope_never_reuses_a_hybrid_prefix(hybrid):
    ids = prompt(200)
    a = joined(hybrid, "key-a", ids)
    with hybrid.new_session() as b:
        assert b.share_prefix("key-b", ids + [1], 0) == 0
        assert b.position == 0
    with hybrid.new_session() as c:
        assert c.share_prefix("key-a", ids + [1], 0) == 200  # a's live state
    a.close()


def test_a_hybrid_cache_that_served_another_scope_offers_no_snapshot(hybrid):
    ids = prompt(200)
    with hybrid.new_session() as s:
        s.prefill(ids)  # computed before it joined any scope
        assert hybrid.kv_stats().snapshots == 0
        assert s.share_prefix("key-b", ids + [1], 200) == 0
        s.prefill(list(range(1, 60)))  # crosses 256 while foreign: nothing offered
        assert hybrid.kv_stats().snapshots == 0
        with hybrid.new_session() as other:
            assert other.share_prefix("key-b", ids + [1], 0) == 0


def test_a_longer_own_checkpoint_is_kept_and_valid_checkpoints_survive_a_shared_prefix(hybrid):
    ids = prompt(200)
    a = joined(hybrid, "", ids)
    with hybrid.new_session() as b:
        b.share_prefix("", ids[:30], 0)
        b.prefill(ids[:30])
        b.prefill(prompt(10, seed=4))  # checkpoints 30 and 40; only 30 agrees with ids
        assert b.share_prefix("", ids + [1], 30) == 200  # a's live state
        assert b.checkpoints == [30]
        b.truncate(30)  # the checkpoint kept is still the state after ids[:30]
        b.prefill(ids[30:])
        assert (b.logits(), greedy(b)) == fresh(hybrid, ids)
        assert b.share_prefix("", ids + [1], 200) == 0  # nothing longer than its own 200
    a.close()


def test_hybrid_snapshots_beyond_their_budget_leave_least_recently_used_first(hybrid):
    prompts = [prompt(70, seed=20 + i) for i in range(SNAPSHOTS + 1)]
    for ids in prompts:
        joined(hybrid, "", ids).close()
    stats = hybrid.kv_stats()
    assert (stats.snapshots, stats.snapshot_bytes) == (SNAPSHOTS, SNAPSHOTS * state_bytes(hybrid))
    with hybrid.new_session() as s:
        assert s.share_prefix("", prompts[0] + [1], 0) == 0  # the oldest went
        assert s.share_prefix("", prompts[-1] + [1], 0) == BLOCK
