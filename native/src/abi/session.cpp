// session.cpp — the C ABI of llmd.h for sessions: prefill, batched decode and
// sampling, speculative verification, truncation, the prefix cache, state export and
// import, grammars, embeddings, scoring and log-probabilities.
#include "abi/handles.h"

#include "memory/session_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

using namespace llmd;
using namespace llmd::abi;

namespace {

// log p(chosen) under the log-softmax of logits l, and the n_top most likely ids
// with their log-probabilities into ids / lps (most likely first, lower id on ties).
float log_softmax_top(const float *l, int n_vocab, int32_t chosen, int n_top, int32_t *ids, float *lps) {
    const float mx = *std::max_element(l, l + n_vocab);
    double sum = 0.0;
    for (int v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(l[v] - mx));
    const double log_sum = std::log(sum);
    int kept = 0; // ids[0..kept) sorted by logit, descending; a later id never passes an equal one
    for (int v = 0; v < n_vocab && n_top > 0; ++v) {
        if (kept == n_top && l[v] <= l[ids[kept - 1]]) continue;
        int j = kept < n_top ? kept++ : n_top - 1;
        for (; j > 0 && l[ids[j - 1]] < l[v]; --j) ids[j] = ids[j - 1];
        ids[j] = v;
    }
    for (int j = 0; j < kept; ++j) lps[j] = static_cast<float>(l[ids[j]] - mx - log_sum);
    return static_cast<float>(l[chosen] - mx - log_sum);
}

llmd_status check_top(int32_t n_top, const int32_t *top_ids, const float *top_logprobs) {
    if (n_top < 0 || n_top > LLMD_MAX_TOP_LOGPROBS)
        return fail(LLMD_ERR_INVALID_ARGUMENT, "n_top must be 0.." + std::to_string(LLMD_MAX_TOP_LOGPROBS));
    if (n_top > 0 && (top_ids == nullptr || top_logprobs == nullptr))
        return fail(LLMD_ERR_INVALID_ARGUMENT, "top_ids and top_logprobs must not be null when n_top > 0");
    return LLMD_OK;
}

// How many of the first `end` ids the session's `tokens` begin with.
int common_prefix(const std::vector<int32_t> &tokens, const int32_t *ids, int end) {
    end = std::min(end, static_cast<int>(tokens.size()));
    int n = 0;
    while (n < end && tokens[n] == ids[n]) ++n;
    return n;
}

// The prediction block's input state is unknown after a cut that its last position
// did not keep: zeros, as at position 0 (drafts stay proposals; only their acceptance
// suffers).
void forget_nextn_state(llmd_session *s) { std::fill(s->nextn_before.begin(), s->nextn_before.end(), 0.0f); }

// Whether the session can return to position pos (0 .. its tokens): LLMD_OK, or the
// status and *why not: the sliding-window layers no longer hold what pos attends, or
// the recurrent layers' state has no checkpoint there.
llmd_status rewindable(const llmd_session *s, int32_t pos, std::string *why) {
    const int floor = s->kv.resume_floor();
    if (pos > 0 && pos < floor) {
        *why = "truncate position " + std::to_string(pos) + " is before " + std::to_string(floor) +
               ": the sliding-window layers no longer hold the positions it attends (truncate to 0)";
        return LLMD_ERR_INVALID_ARGUMENT;
    }
    const bool here = static_cast<size_t>(pos) == s->tokens.size();
    if (!s->rs.empty() && pos > 0 && !here && !s->rs.has_checkpoint(pos)) {
        std::string at;
        for (const auto &c : s->rs.checkpoints) at += (at.empty() ? "" : ", ") + std::to_string(c.pos);
        *why = "truncate position " + std::to_string(pos) +
               " is not a checkpoint of the recurrent layers' state (they can return to 0, " +
               (at.empty() ? "" : at + ", ") + "or stay at " + std::to_string(s->tokens.size()) + ")";
        return LLMD_ERR_STATE;
    }
    return LLMD_OK;
}

// Returns the session to position pos (rewindable), with no logits.
void rewind(llmd_session *s, int32_t pos) {
    const bool here = static_cast<size_t>(pos) == s->tokens.size();
    s->kv.truncate(pos);
    s->reply_snapshot = 0;
    if (!here) forget_nextn_state(s);
    if (pos == 0) s->rs.reset();
    else if (!here && !s->rs.empty()) s->rs.restore(pos);
    s->tokens.resize(pos);
    s->pending = -1;
    s->logits_valid = false;
}

// With recurrent layers: offers the state after the session's tokens to the prefix
// cache when they end a block that the session published (recurrent.h:
// SnapshotCache), in place of the snapshot `replaces` (0: none). Returns the
// snapshot's serial, or 0 when none was taken.
uint64_t publish_snapshot(llmd_session *s, uint64_t replaces = 0) {
    const int full = static_cast<int>(s->tokens.size()) / kKVBlock;
    if (s->rs.empty() || !s->engine->kv_shares || s->tokens.size() % kKVBlock != 0 || full == 0 ||
        !s->kv.sharing || s->kv.foreign || s->kv.published < full)
        return 0;
    const uint64_t serial = s->engine->kv_pool->serial(s->kv.blocks[full - 1]);
    s->engine->snapshots->put(serial, s->rs.now, replaces);
    return serial;
}

// llmd_session_share_prefix for a model with recurrent layers: the longest prefix of
// ids whose recurrent state the engine holds, if longer than keep. That is a chain of
// the scope's published blocks that ends where a snapshot of the state was taken
// (whole blocks), or a position of one of `peers` (the scope's sessions that may lend,
// this one too) where it holds the state, live or as a checkpoint, and its blocks
// before it are published: those are held, its partly filled block there copied,
// its state copied.
llmd_status share_recurrent_prefix(llmd_session *s, const int32_t *ids, int limit, int32_t keep,
                                   const std::vector<const llmd_session *> &peers, int32_t *reused) {
    llmd_engine *e = s->engine;
    PrefixMatch m = e->kv_pool->match(s->kv.scope, ids, limit, {});
    size_t full = m.blocks.size();
    const std::vector<float> *state = nullptr;
    for (; full > 0 && static_cast<int>(full) * kKVBlock > keep; --full)
        if ((state = e->snapshots->find(e->kv_pool->serial(m.blocks[full - 1]))) != nullptr) break;
    int at = state != nullptr ? static_cast<int>(full) * kKVBlock : 0;
    m.trim(at);
    for (const llmd_session *h : peers) {
        const int common = common_prefix(h->tokens, ids, limit);
        // The live state, unless a pass failed part way through it (its pos ran ahead of
        // the tokens), or a checkpoint (taken only where a pass ended).
        const bool live = static_cast<int>(h->tokens.size()) <= common && h->rs.pos == common;
        int point = live ? common : 0;
        for (const RecurrentState::Checkpoint &c : h->rs.checkpoints)
            if (c.pos <= common) point = std::max(point, c.pos);
        if (point <= at || h->kv.published < point / kKVBlock) continue;
        at = point;
        state = h->rs.state_at(point);
        m.blocks.assign(h->kv.blocks.begin(), h->kv.blocks.begin() + point / kKVBlock);
        m.tail_len = point % kKVBlock;
        m.tail_block = m.tail_len > 0 ? h->kv.blocks[point / kKVBlock] : -1;
    }
    if (state == nullptr || at <= keep) return LLMD_OK;
    const int valid = common_prefix(s->tokens, ids, at); // the session's own checkpoints up to here still hold for ids
    s->kv.adopt(m);
    s->rs.adopt(at, *state, valid); // a state of this session's own is read before its checkpoints are trimmed
    s->tokens.assign(ids, ids + at);
    forget_nextn_state(s);
    s->pending = -1;
    s->logits_valid = false;
    s->reply_snapshot = 0;
    *reused = at;
    return LLMD_OK;
}

// Samples the session's next token from logits (n_vocab; the sampler works on a copy
// in scratch) as a decode step does: its sampler, penalties over its tokens, and its
// grammar, which then takes the token. Logits that are not all finite (corrupt
// weights, or an input that overflows them) are a failure, never a token drawn from them.
llmd_status sample_token(llmd_session *s, const float *logits, std::vector<float> &scratch, llmd_token *out) {
    const llmd_engine *e = s->engine;
    const int n_vocab = static_cast<int>(scratch.size());
    bool finite = true;
    for (int i = 0; i < n_vocab; ++i) {
        scratch[i] = logits[i];
        finite &= std::isfinite(logits[i]);
    }
    if (!finite)
        return fail(LLMD_ERR_INTERNAL, "the model's logits are not all finite (NaN or infinity): its weights are "
                                       "corrupt, or this input overflows them");
    bool forced = false;
    const int32_t id = s->sampler.sample(scratch.data(), n_vocab, s->tokens, s->grammar.get(), &forced);
    if (s->grammar && (id < 0 || !s->grammar->error().empty()))
        return fail(LLMD_ERR_STATE, "grammar: " + (id < 0 ? std::string("no token of the vocabulary can continue")
                                                          : s->grammar->error()));
    if (s->grammar) s->grammar->accept(id);
    const bool completed = s->grammar && s->grammar->complete();
    const std::string_view piece = e->vocab->is_control(id) ? std::string_view() : e->vocab->piece(id);
    *out = llmd_token{id, piece.data(), piece.size(), id == e->eos_id, e->is_eog(id) || completed, 0, forced, 0,
                      nullptr};
    return LLMD_OK;
}

// The token of a session whose step failed with status st (the message in g_error).
llmd_token failed_token(llmd_session *s, llmd_status st) {
    s->failure = g_error;
    return llmd_token{0, "", 0, 0, 0, 0, 0, st, s->failure.c_str()};
}

// Sessions of one step: live, distinct and of one engine.
llmd_status check_batch(llmd_session *const *sessions, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (const llmd_status st = check_session(sessions[i]); st != LLMD_OK) return st;
        if (sessions[i]->engine != sessions[0]->engine)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "a batch must use sessions of one engine");
        for (size_t j = 0; j < i; ++j)
            if (sessions[j] == sessions[i]) return fail(LLMD_ERR_INVALID_ARGUMENT, "a session appears twice in a batch");
    }
    return LLMD_OK;
}

// A state holds no keys and values of the prediction block (it holds the model's
// layers alone): they are zeroed for its positions, which the block's attention then
// weighs as nothing, and so is its input state.
void forget_nextn_block(llmd_session *s) {
    const int block = s->engine->model->hp.n_layer;
    const KVCache::Layer &L = s->kv.layers[block];
    const std::vector<float> zeros(L.hd, 0.0f);
    for (int pos = 0; pos < static_cast<int>(s->tokens.size()); ++pos)
        for (int h = 0; h < L.heads; ++h) s->kv.write(block, h, pos, zeros.data(), zeros.data());
    forget_nextn_state(s);
}

// forward() of tokens of the sessions `owners` (a session's tokens consecutive, in
// order), and, where the engine drafts with the prediction block, that block over the
// same tokens, each paired with the state of the position before it (the row before
// it in the batch, or its session's nextn_before), so that the block's keys and values
// follow every token a session holds. Each session's nextn_before is left at its last
// token's state; `states` (n, dim), if given, receives every token's.
void advance(llmd_engine *e, llmd_session *const *owners, const BatchToken *batch, int n, float *logits,
             float *hidden = nullptr, float *states = nullptr) {
    if (!e->nextn) {
        forward(*e->model, batch, n, e->ws, *e->pool, logits, hidden);
        return;
    }
    const size_t dim = static_cast<size_t>(e->model->hp.n_embd);
    std::vector<float> own, before(n * dim);
    if (states == nullptr) {
        own.resize(n * dim);
        states = own.data();
    }
    forward(*e->model, batch, n, e->ws, *e->pool, logits, hidden, states);
    for (int t = 0; t < n; ++t) {
        const bool follows = t > 0 && owners[t - 1] == owners[t];
        const float *row = follows ? states + (t - 1) * dim : owners[t]->nextn_before.data();
        std::copy_n(row, dim, before.data() + t * dim);
    }
    std::vector<BatchToken> block(batch, batch + n);
    for (BatchToken &b : block) {
        b.logits = false; // the block's keys and values, no drafts here
        b.rs = nullptr;
    }
    forward_nextn(*e->model, block.data(), n, before.data(), e->ws, *e->pool, nullptr, nullptr);
    for (int t = 0; t < n; ++t)
        if (t + 1 == n || owners[t + 1] != owners[t]) // its session's last
            std::copy_n(states + t * dim, dim, owners[t]->nextn_before.data());
}

// Where a step's results go: session i's tokens from out + at[i] (room for its drafts
// and one token more), n_out[i] of them; with logprobs (null: none asked for) their
// logprobs from logprobs + at[i] and, unless n_top[i] < 0, n_top[i] top ids and
// logprobs each from top_at[i].
struct StepOut {
    llmd_token *out;
    size_t *n_out;
    const size_t *at;
    float *logprobs = nullptr;
    const int32_t *n_top = nullptr;
    int32_t *top_ids = nullptr;
    float *top_logprobs = nullptr;
    const size_t *top_at = nullptr;
};

// A step of generation for n sessions that are live, distinct and of one engine, each
// verifying the drafts that follow its pending token (k[i] ids from drafts[i], which
// fit its context; none for a session without one): the pending tokens and the drafts
// go through the model in one forward pass, with logits at every position; then each
// session samples position by position as plain steps would, and goes on while the
// sampled id equals its draft there. A session that fails to sample is left as a plain
// step that failed leaves it, with the logits it failed on, and its last token says
// why (failed_token); the others still take their tokens.
llmd_status step(llmd_session *const *sessions, size_t n, const int32_t *const *drafts, const size_t *k,
                 const StepOut &o) {
    llmd_engine *e = sessions[0]->engine;
    const int n_vocab = e->model->hp.n_vocab;
    std::vector<char> stopped(n); // decided once, so a stop() racing this step is seen next step
    std::vector<BatchToken> batch;
    std::vector<llmd_session *> owners; // each token's session
    std::vector<size_t> row(n); // session i's first row of logits, when it has a pending token
    for (size_t i = 0; i < n; ++i) {
        llmd_session *s = sessions[i];
        stopped[i] = s->stop.load();
        if (stopped[i]) continue;
        if (s->pending < 0) {
            if (k[i] > 0) return fail(LLMD_ERR_STATE, "drafts follow a pending token: decode one step first");
            if (!s->logits_valid) return fail(LLMD_ERR_STATE, "decode needs a prefill first");
            continue;
        }
        const int pos = static_cast<int>(s->tokens.size());
        if (pos >= e->n_ctx)
            return fail(LLMD_ERR_CONTEXT_FULL, "the context is full (" + std::to_string(e->n_ctx) + " tokens)");
        row[i] = batch.size();
        batch.push_back({&s->kv, s->pending, pos, true, &s->rs});
        for (size_t j = 0; j < k[i]; ++j)
            batch.push_back({&s->kv, drafts[i][j], static_cast<int32_t>(pos + 1 + j), true, &s->rs});
        owners.resize(batch.size(), s);
    }
    // A recurrent state cannot be cut back: a session verifying drafts keeps the states
    // after its first positions (the pending token's and the first draft's), to go back
    // to if a draft is rejected (RecurrentState::trail).
    for (size_t i = 0; i < n; ++i)
        if (k[i] > 0 && !stopped[i] && !sessions[i]->rs.empty())
            sessions[i]->rs.start_trail(static_cast<int>(sessions[i]->tokens.size()),
                                        std::min(static_cast<int>(k[i]), kTrail));
    std::vector<float> logits(batch.size() * static_cast<size_t>(n_vocab));
    const size_t dim = static_cast<size_t>(e->model->hp.n_embd);
    std::vector<float> states(e->nextn ? batch.size() * dim : 0); // for the state of the last position kept
    for (size_t b = 0; b < batch.size(); b += kMaxBatch) {
        const int m = static_cast<int>(std::min<size_t>(kMaxBatch, batch.size() - b));
        advance(e, owners.data() + b, batch.data() + b, m, logits.data() + b * n_vocab, nullptr,
                e->nextn ? states.data() + b * dim : nullptr);
    }
    std::vector<float> scratch(n_vocab);
    for (size_t i = 0; i < n; ++i) {
        llmd_session *s = sessions[i];
        llmd_token *out = o.out + o.at[i];
        const auto score = [&](size_t j, const float *l) { // token j's logprob and top list, if asked for
            if (o.logprobs == nullptr || o.n_top[i] < 0) return;
            const size_t top = o.top_at[i] + j * o.n_top[i];
            o.logprobs[o.at[i] + j] = log_softmax_top(l, n_vocab, out[j].token_id, o.n_top[i], o.top_ids + top,
                                                      o.top_logprobs + top);
        };
        o.n_out[i] = 1;
        if (stopped[i]) {
            out[0] = llmd_token{0, "", 0, 0, 0, 1, 0, 0, nullptr};
            continue;
        }
        if (s->pending < 0) { // the first step of a reply samples the prefill's logits
            if (const llmd_status st = sample_token(s, s->logits.data(), scratch, out); st != LLMD_OK) {
                out[0] = failed_token(s, st);
                continue;
            }
            s->pending = out[0].token_id;
            score(0, s->logits.data());
            continue;
        }
        const int pos = static_cast<int>(s->tokens.size());
        s->tokens.push_back(s->pending);
        s->pending = -1;
        size_t j = 0; // tokens sampled
        for (;;) {
            const float *l = logits.data() + (row[i] + j) * n_vocab;
            if (const llmd_status st = sample_token(s, l, scratch, out + j); st != LLMD_OK) {
                out[j++] = failed_token(s, st);
                std::copy_n(l, n_vocab, s->logits.data());
                break;
            }
            score(j, l);
            if (++j > k[i] || out[j - 1].token_id != drafts[i][j - 1] || out[j - 1].is_terminal) {
                s->pending = out[j - 1].token_id;
                std::copy_n(l, n_vocab, s->logits.data());
                break;
            }
            s->tokens.push_back(out[j - 1].token_id);
        }
        o.n_out[i] = j;
        s->logits_valid = true;
        const int kept = static_cast<int>(s->tokens.size()); // the pending token and the accepted drafts
        s->kv.truncate(kept);
        if (e->nextn) std::copy_n(states.data() + (row[i] + kept - 1 - pos) * dim, dim, s->nextn_before.data());
        // The recurrent state after the last position kept: the pass's own when it kept
        // them all; else the trail's latest state at or before it, the accepted tokens
        // after that run again. Plain steps would also have offered the state at a block
        // boundary they passed to the prefix cache (publish_snapshot); the pass went by it.
        const int boundary = kept / kKVBlock * kKVBlock;
        const bool passed = boundary > pos && boundary < kept;
        const bool all = kept == pos + 1 + static_cast<int>(k[i]);
        RecurrentState &rs = s->rs;
        if (!rs.empty() && k[i] > 0 && (!all || passed)) {
            std::vector<BatchToken> again(kept - pos);
            auto to = [&](int target) { // the state after the first `target` positions
                int from = std::min(target - 1, rs.trail_from + rs.trail_n - 1); // the position it is after
                if (rs.pos > from + 1 && rs.pos <= target) from = rs.pos - 1; // now is later, and not past it
                else rs.back_to_trail(from);
                for (int t = from + 1; t < target; ++t) again[t - from - 1] = {&s->kv, s->tokens[t], t, false, &rs};
                if (target > from + 1) forward(*e->model, again.data(), target - from - 1, e->ws, *e->pool, nullptr);
            };
            std::vector<float> last; // every position kept: the pass's own state, aside while the boundary's is made
            if (passed) {
                if (all) last = rs.now;
                to(boundary);
                const std::vector<int32_t> tail(s->tokens.begin() + boundary, s->tokens.end());
                s->tokens.resize(boundary);
                s->kv.publish(s->tokens);
                if (const uint64_t serial = publish_snapshot(s, s->reply_snapshot); serial != 0) s->reply_snapshot = serial;
                s->tokens.insert(s->tokens.end(), tail.begin(), tail.end());
            }
            if (all) {
                std::copy(last.begin(), last.end(), rs.now.begin());
                rs.pos = kept;
            } else {
                to(kept);
            }
        }
        rs.start_trail(0, 0); // kept no longer
        s->kv.publish(s->tokens);
        // The newest block boundary of a reply is what the next turn can resume from;
        // the one before it, taken by this reply, makes room.
        if (const uint64_t serial = publish_snapshot(s, s->reply_snapshot); serial != 0) s->reply_snapshot = serial;
    }
    return LLMD_OK;
}

// A prefix of the session that its cache holds whole: 0, or from resume_floor on,
// and with recurrent layers the position or a checkpoint.
llmd_status check_state_prefix(const llmd_session *s, int32_t n) {
    if (n < 0 || static_cast<size_t>(n) > s->tokens.size())
        return fail(LLMD_ERR_INVALID_ARGUMENT, "n_tokens " + std::to_string(n) + " is outside 0.." +
                                                   std::to_string(s->tokens.size()));
    if (n > 0 && n < s->kv.resume_floor())
        return fail(LLMD_ERR_INVALID_ARGUMENT, "n_tokens " + std::to_string(n) + " is before " +
                                                   std::to_string(s->kv.resume_floor()) +
                                                   ": the sliding-window layers no longer hold what it attends");
    if (!s->rs.empty() && n > 0 && static_cast<size_t>(n) != s->tokens.size() && !s->rs.has_checkpoint(n))
        return fail(LLMD_ERR_STATE, "n_tokens " + std::to_string(n) +
                                        " is not a checkpoint of the recurrent layers' state, nor the position");
    return LLMD_OK;
}

} // namespace

extern "C" {

llmd_status llmd_session_new(llmd_engine *e, llmd_session **out) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || out == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        *out = nullptr;
        if (const llmd_status st = check_weights(e); st != LLMD_OK) return st;
        if (static_cast<int>(e->sessions.size()) >= e->max_sessions)
            return fail(LLMD_ERR_CAPACITY, "all " + std::to_string(e->max_sessions) + " session slots are in use");
        auto s = std::make_unique<llmd_session>();
        s->engine = e;
        const HParams &hp = e->model->hp;
        KVCache::Sizes sizes;
        s->kv.layers = KVCache::layout(hp, e->cached_blocks(), e->n_ctx, e->kv_types, &sizes);
        s->kv.types = e->kv_types;
        s->kv.pool = e->kv_pool.get();
        // Uninitialised on purpose: pages are touched only as positions fill.
        s->kv.k.reset(new (std::nothrow) uint8_t[sizes.ring_k]);
        s->kv.v.reset(new (std::nothrow) uint8_t[sizes.ring_v]);
        if (!s->kv.k || !s->kv.v) return fail(LLMD_ERR_OUT_OF_MEMORY, "out of memory for a KV cache");
        s->rs.init(hp);
        s->logits.resize(hp.n_vocab);
        if (e->nextn) s->nextn_before.assign(hp.n_embd, 0.0f);
        llmd_sampling greedy{};
        greedy.repeat_penalty = 1.0f;
        greedy.top_p = 1.0f;
        std::string err;
        s->sampler.configure(greedy, *e->vocab, &err);
        {
            std::lock_guard<std::mutex> lock(g_live_mutex);
            g_live.insert(s.get());
        }
        *out = s.get();
        e->sessions.push_back(std::move(s));
        return LLMD_OK;
    });
}

void llmd_session_free(llmd_session *s) {
    {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        if (s == nullptr || g_live.erase(s) == 0) return;
    }
    auto &list = s->engine->sessions;
    list.erase(std::remove_if(list.begin(), list.end(), [&](const auto &p) { return p.get() == s; }), list.end());
}

llmd_status llmd_session_reset(llmd_session *s) { return llmd_session_truncate(s, 0); }

llmd_status llmd_session_prefill(llmd_session *s, const int32_t *ids, size_t n) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        llmd_engine *e = s->engine;
        if (n == 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "prefill needs at least one token");
        if (const llmd_status st = check_ids(e, ids, n); st != LLMD_OK) return st;
        const size_t pos = s->tokens.size();
        if (n > static_cast<size_t>(e->n_ctx) - pos)
            return fail(LLMD_ERR_CONTEXT_FULL, std::to_string(pos + n) + " tokens do not fit the context of " +
                                                   std::to_string(e->n_ctx));
        s->pending = -1; // a sampled token that was never fed is not part of the sequence
        s->logits_valid = false;
        s->rs.checkpoint(); // the end of a reply that this prefill continues
        s->reply_snapshot = 0; // that reply's snapshot stays
        // With recurrent layers, a chunk ends at the last block boundary of the prompt,
        // where the state is offered to the prefix cache (prefill is chunk-invariant).
        const size_t boundary = s->rs.empty() ? 0 : (pos + n) / kKVBlock * kKVBlock;
        std::vector<BatchToken> batch(std::min<size_t>(n, kMaxBatch));
        for (size_t i = 0; i < n;) {
            size_t m = std::min<size_t>(kMaxBatch, n - i);
            if (pos + i < boundary) m = std::min(m, boundary - pos - i);
            for (size_t j = 0; j < m; ++j)
                batch[j] = {&s->kv, ids[i + j], static_cast<int32_t>(pos + i + j), i + j == n - 1, &s->rs};
            const std::vector<llmd_session *> owners(m, s);
            advance(e, owners.data(), batch.data(), static_cast<int>(m), s->logits.data());
            s->tokens.insert(s->tokens.end(), ids + i, ids + i + m);
            s->kv.publish(s->tokens);
            i += m;
            if (pos + i == boundary) publish_snapshot(s);
        }
        s->rs.checkpoint();
        s->logits_valid = true;
        return LLMD_OK;
    });
}

llmd_status llmd_session_set_sampling(llmd_session *s, const llmd_sampling *sampling) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (sampling == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "sampling must not be null");
        std::string err;
        if (!s->sampler.configure(*sampling, *s->engine->vocab, &err))
            return fail(LLMD_ERR_INVALID_ARGUMENT, err);
        s->stop.store(false);
        return LLMD_OK;
    });
}

llmd_status llmd_session_decode_one(llmd_session *s, llmd_token *out) {
    const llmd_status st = llmd_session_decode_batch(&s, 1, out);
    return st == LLMD_OK && out->failed ? fail(static_cast<llmd_status>(out->failed), s->failure) : st;
}

llmd_status llmd_session_decode_batch(llmd_session *const *sessions, size_t n, llmd_token *out) {
    return guarded([&]() -> llmd_status {
        if (sessions == nullptr || out == nullptr || n == 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "empty batch");
        if (const llmd_status st = check_batch(sessions, n); st != LLMD_OK) return st;
        std::vector<size_t> none(n), at(n), n_out(n); // no drafts: one token each
        std::iota(at.begin(), at.end(), size_t{0});
        return step(sessions, n, nullptr, none.data(), StepOut{out, n_out.data(), at.data()});
    });
}

llmd_status llmd_session_decode_drafts(llmd_session *const *sessions, size_t n, const int32_t *drafts,
                                       const size_t *n_drafts, const int32_t *n_top, llmd_token *out, float *logprobs,
                                       int32_t *top_ids, float *top_logprobs, size_t *n_out) {
    return guarded([&]() -> llmd_status {
        if (sessions == nullptr || n == 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "empty batch");
        if (n_drafts == nullptr || out == nullptr || n_out == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "n_drafts, out and n_out must not be null");
        if ((logprobs == nullptr) != (n_top == nullptr))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "logprobs and n_top go together");
        if (const llmd_status st = check_batch(sessions, n); st != LLMD_OK) return st;
        std::fill_n(n_out, n, 0);
        llmd_engine *e = sessions[0]->engine;
        std::vector<const int32_t *> from(n);
        std::vector<size_t> k(n), at(n), top_at(n);
        size_t id = 0, token = 0, top = 0;
        for (size_t i = 0; i < n; ++i) {
            if (n_drafts[i] > LLMD_MAX_DRAFT)
                return fail(LLMD_ERR_INVALID_ARGUMENT, "n_draft " + std::to_string(n_drafts[i]) + " is more than " +
                                                           std::to_string(LLMD_MAX_DRAFT));
            if (n_drafts[i] > 0 && drafts == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "drafts must not be null");
            if (n_top != nullptr && n_top[i] >= 0)
                if (const llmd_status st = check_top(n_top[i], top_ids, top_logprobs); st != LLMD_OK) return st;
            from[i] = drafts == nullptr ? nullptr : drafts + id;
            if (const llmd_status st = check_ids(e, from[i], n_drafts[i]); st != LLMD_OK) return st;
            // Drafts past the context are not verified.
            const size_t n_ctx = static_cast<size_t>(e->n_ctx);
            const size_t room = n_ctx - std::min(sessions[i]->tokens.size() + 1, n_ctx);
            k[i] = sessions[i]->pending < 0 ? n_drafts[i] : std::min(n_drafts[i], room);
            at[i] = token;
            top_at[i] = top;
            id += n_drafts[i];
            token += n_drafts[i] + 1;
            if (n_top != nullptr && n_top[i] > 0) top += (n_drafts[i] + 1) * static_cast<size_t>(n_top[i]);
        }
        return step(sessions, n, from.data(), k.data(),
                    StepOut{out, n_out, at.data(), logprobs, n_top, top_ids, top_logprobs, top_at.data()});
    });
}

llmd_status llmd_session_draft_nextn(llmd_session *s, size_t k, int32_t *out, size_t *n_out) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (n_out == nullptr || (out == nullptr && k > 0)) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        *n_out = 0;
        llmd_engine *e = s->engine;
        if (!e->nextn) return fail(LLMD_ERR_STATE, "the engine was opened without draft_nextn");
        if (k > LLMD_MAX_DRAFT)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "k " + std::to_string(k) + " is more than " +
                                                       std::to_string(LLMD_MAX_DRAFT));
        if (s->pending < 0) return fail(LLMD_ERR_STATE, "drafts follow a pending token: decode one step first");
        const HParams &hp = e->model->hp;
        const int pos = static_cast<int>(s->tokens.size()); // the pending token's; draft j verifies at pos + 1 + j
        k = std::min(k, static_cast<size_t>(std::max(0, e->n_ctx - pos - 1)));
        std::vector<float> before = s->nextn_before, state(hp.n_embd), logits(hp.n_vocab);
        int32_t token = s->pending;
        for (size_t j = 0; j < k; ++j) {
            const BatchToken t{&s->kv, token, static_cast<int32_t>(pos + j), true, nullptr};
            forward_nextn(*e->model, &t, 1, before.data(), e->ws, *e->pool, logits.data(), state.data());
            token = s->sampler.pick_biased(logits.data(), hp.n_vocab);
            out[j] = token;
            before.swap(state);
        }
        *n_out = k;
        return LLMD_OK;
    });
}

llmd_status llmd_session_truncate(llmd_session *s, int32_t pos) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (pos < 0 || static_cast<size_t>(pos) > s->tokens.size())
            return fail(LLMD_ERR_INVALID_ARGUMENT, "truncate position " + std::to_string(pos) + " is outside 0.." +
                                                       std::to_string(s->tokens.size()));
        std::string why;
        if (const llmd_status st = rewindable(s, pos, &why); st != LLMD_OK) return fail(st, why);
        rewind(s, pos);
        return LLMD_OK;
    });
}

llmd_status llmd_session_share_prefix(llmd_session *s, const char *scope, size_t scope_len, const int32_t *ids,
                                      size_t n, int32_t keep, int32_t *reused) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (reused == nullptr || (scope == nullptr && scope_len > 0) || keep < 0 || n == 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "share_prefix needs ids, keep >= 0 and an output");
        llmd_engine *e = s->engine;
        if (const llmd_status st = check_ids(e, ids, n); st != LLMD_OK) return st;
        *reused = 0;
        if (!e->kv_shares) return LLMD_OK;
        const std::string joined(scope ? scope : "", scope_len);
        if (!s->tokens.empty() && (!s->kv.sharing || s->kv.scope != joined)) s->kv.foreign = true;
        s->kv.sharing = true;
        s->kv.scope = joined;
        std::vector<const llmd_session *> peers; // the scope's sessions that may lend (s too, unless foreign)
        for (const auto &other : e->sessions)
            if (other->kv.sharing && !other->kv.foreign && other->kv.scope == joined) peers.push_back(other.get());
        const int limit = static_cast<int>(std::min<size_t>(n - 1, static_cast<size_t>(e->n_ctx)));
        if (!s->rs.empty()) return share_recurrent_prefix(s, ids, limit, keep, peers, reused);
        std::vector<PrefixHolder> holders;
        for (const llmd_session *p : peers) holders.push_back({&p->kv, &p->tokens});
        PrefixMatch m = e->kv_pool->match(s->kv.scope, ids, limit, holders);
        // Sliding-window layers keep no blocks: their part of a prefix comes from a live
        // session of the scope whose rings still hold the window the prefix's next
        // position attends (the prefix reaches its resume floor), copied.
        const KVCache *rings = nullptr;
        int ring_begin = 0;
        if (s->kv.has_rings()) {
            int best = 0;
            for (const PrefixHolder &h : holders) {
                const int common = common_prefix(*h.tokens, ids, m.length());
                if (common > best && common >= h.kv->resume_floor()) {
                    best = common;
                    rings = h.kv;
                }
            }
            m.trim(best);
            for (const KVCache::Layer &L : s->kv.layers) // no more than a ring holds, nothing its source lost
                if (L.paged < 0 && L.slots > 0 && rings != nullptr)
                    ring_begin = std::max({ring_begin, rings->held_from(L), best - L.slots});
        }
        if (m.length() <= keep) return LLMD_OK;
        s->kv.adopt(m);
        if (rings != nullptr) {
            if (rings != &s->kv) s->kv.copy_rings(*rings, ring_begin, m.length()); // its own are in place
            s->kv.ring_low = ring_begin;
        }
        s->tokens.assign(ids, ids + m.length());
        forget_nextn_state(s);
        s->pending = -1;
        s->logits_valid = false;
        *reused = m.length();
        return LLMD_OK;
    });
}

llmd_status llmd_session_resume_floor(const llmd_session *s, int32_t *pos) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (pos == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "pos must not be null");
        *pos = s->kv.resume_floor();
        return LLMD_OK;
    });
}

llmd_status llmd_session_checkpoints(const llmd_session *s, int32_t *out, size_t capacity, size_t *n) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (n == nullptr || (out == nullptr && capacity > 0)) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        *n = s->rs.checkpoints.size();
        if (*n > capacity) return fail(LLMD_ERR_INVALID_ARGUMENT, "checkpoint buffer too small");
        for (size_t i = 0; i < *n; ++i) out[i] = s->rs.checkpoints[i].pos;
        return LLMD_OK;
    });
}

llmd_status llmd_session_position(const llmd_session *s, int32_t *pos) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (pos == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "pos must not be null");
        *pos = static_cast<int32_t>(s->tokens.size());
        return LLMD_OK;
    });
}

llmd_status llmd_session_tokens(const llmd_session *s, int32_t *out, size_t capacity, size_t *n_out) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (n_out == nullptr || (out == nullptr && capacity > 0)) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        *n_out = s->tokens.size();
        if (s->tokens.size() > capacity) return fail(LLMD_ERR_INVALID_ARGUMENT, "token buffer too small");
        std::copy(s->tokens.begin(), s->tokens.end(), out);
        return LLMD_OK;
    });
}

llmd_status llmd_session_state_size(const llmd_session *s, int32_t n_tokens, size_t *bytes) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (bytes == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "bytes must not be null");
        if (const llmd_status st = check_state_prefix(s, n_tokens); st != LLMD_OK) return st;
        *bytes = state_bytes(s->engine->model->hp, s->kv, s->rs, n_tokens);
        return LLMD_OK;
    });
}

llmd_status llmd_session_export(const llmd_session *s, int32_t n_tokens, uint8_t *out, size_t len) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (const llmd_status st = check_state_prefix(s, n_tokens); st != LLMD_OK) return st;
        const HParams &hp = s->engine->model->hp;
        if (out == nullptr || len != state_bytes(hp, s->kv, s->rs, n_tokens))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "the state buffer must hold exactly llmd_session_state_size bytes");
        state_write(hp, s->kv, s->rs, s->engine->n_ctx, s->tokens.data(), n_tokens, out);
        return LLMD_OK;
    });
}

llmd_status llmd_session_import(llmd_session *s, const uint8_t *data, size_t len) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (data == nullptr && len > 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "data must not be null");
        std::string err;
        std::vector<int32_t> tokens;
        bool read = false;
        try {
            read = state_read(s->engine->model->hp, s->kv, s->rs, s->engine->n_ctx, data, len, &tokens, &err);
        } catch (...) { // out of memory part way: the cache is emptied, and so are its ids and state
            s->kv.truncate(0);
            s->rs.reset();
            s->tokens.clear();
            s->pending = -1;
            s->logits_valid = false;
            throw;
        }
        if (!read) return fail(LLMD_ERR_FORMAT, err);
        s->tokens = std::move(tokens);
        if (s->engine->nextn) forget_nextn_block(s);
        s->reply_snapshot = 0;
        s->pending = -1;
        s->logits_valid = false;
        return LLMD_OK;
    });
}

void llmd_session_stop(llmd_session *s) {
    // Under the lock: a session cannot be freed between the check and the store.
    std::lock_guard<std::mutex> lock(g_live_mutex);
    if (s != nullptr && g_live.count(s) != 0) s->stop.store(true);
}

llmd_status llmd_session_set_grammar(llmd_session *s, const char *grammar, size_t len, int32_t token_budget) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (len == 0) {
            s->grammar.reset();
            return LLMD_OK;
        }
        if (grammar == nullptr || token_budget < 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "grammar must not be null and token_budget not negative");
        std::string err;
        std::unique_ptr<const Grammar> g = Grammar::parse(std::string_view(grammar, len), &err);
        if (!g) return fail(LLMD_ERR_INVALID_ARGUMENT, "grammar: " + err);
        llmd_engine *e = s->engine;
        if (!e->trie) e->trie = std::make_unique<TokenTrie>(*e->vocab, e->eog_ids);
        for (const int32_t id : g->token_ids()) // a token edge stands for a control token that writes no bytes
            if (id >= e->vocab->size() || !e->vocab->is_control(id) || e->trie->is_eog(id))
                return fail(LLMD_ERR_INVALID_ARGUMENT,
                            "grammar: token " + std::to_string(id) + " is not a control token of this model");
        s->grammar = std::make_unique<GrammarMatcher>(std::move(g), e->trie.get(), token_budget);
        return LLMD_OK;
    });
}

llmd_status llmd_session_grammar_mask(llmd_session *s, uint8_t *out, size_t n, int32_t fast) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (!s->grammar) return fail(LLMD_ERR_STATE, "the session has no grammar");
        if (out == nullptr || n != static_cast<size_t>(s->engine->vocab->size()))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "the mask buffer must hold n_vocab bytes");
        std::vector<uint32_t> reference;
        if (!fast) s->grammar->token_costs_reference(reference);
        const std::vector<uint32_t> &costs = fast ? s->grammar->token_costs() : reference;
        if (!s->grammar->error().empty()) return fail(LLMD_ERR_STATE, "grammar: " + s->grammar->error());
        for (size_t i = 0; i < n; ++i)
            out[i] = costs[i] == GrammarMatcher::kRejected ? 0 : s->grammar->within_budget(costs[i]) ? 2 : 1;
        return LLMD_OK;
    });
}

llmd_status llmd_session_embed(llmd_session *s, const int32_t *ids, size_t n, float *out, size_t n_out) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        llmd_engine *e = s->engine;
        const int dim = e->model->hp.n_embd;
        int32_t pooling = 0;
        if (const llmd_status st = read_pooling(e, &pooling); st != LLMD_OK) return st;
        const Classifier &head = e->model->classifier;
        const bool rank = pooling == 4;
        if (pooling == 0) return fail(LLMD_ERR_UNSUPPORTED, "the model declares no pooling: it makes no embeddings");
        if (rank && head.out.rows == 0)
            return fail(LLMD_ERR_UNSUPPORTED, "the model declares rank pooling and has no classifier head "
                                              "(cls.output.weight) to score with");
        const size_t width = rank ? static_cast<size_t>(head.out.rows) : static_cast<size_t>(dim);
        if (n == 0 || out == nullptr || n_out != width)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "embed needs at least one token and an output of " +
                                                       std::to_string(width) +
                                                       (rank ? " floats (one per label)" : " floats (n_embd)"));
        std::string err;
        bool causal = true;
        const std::string causal_key = family_key(e, "attention.causal");
        if (!e->file->get_bool(causal_key, &causal, &err) && !err.empty()) return fail(LLMD_ERR_FORMAT, err);
        if (!causal) // every token would attend the whole input, which the forward pass does not do
            return fail(LLMD_ERR_UNSUPPORTED, "the model's attention is not causal (" + causal_key +
                                                  " is false); llmd runs causal attention only");
        if (const llmd_status st = check_ids(e, ids, n); st != LLMD_OK) return st;
        if (n > static_cast<size_t>(e->n_ctx))
            return fail(LLMD_ERR_CONTEXT_FULL, std::to_string(n) + " tokens do not fit the context of " +
                                                   std::to_string(e->n_ctx));
        // The pooled token: CLS's first, LAST's and a causal reranker's last (as llama.cpp
        // reads them); the mean takes every token's state.
        const bool mean = pooling == 1;
        const size_t pooled = pooling == 2 ? 0 : n - 1;
        // The input runs from the first position the cache does not hold already (a
        // reranker's next document after the same query), as a prefill resumes: the
        // same bits as from position 0. The mean runs from 0, to see every token.
        size_t kept = 0;
        if (!mean) {
            const size_t limit = std::min(pooled, s->tokens.size());
            while (kept < limit && s->tokens[kept] == ids[kept]) ++kept;
            if (std::string why; rewindable(s, static_cast<int32_t>(kept), &why) != LLMD_OK) kept = 0;
        }
        rewind(s, static_cast<int32_t>(kept));
        // An input is no scope's prompt: the cache lends none of it to the prefix cache's
        // scope it last joined (share_prefix finds it foreign until it is emptied).
        s->kv.sharing = false;
        std::vector<float> hidden(static_cast<size_t>(std::min<size_t>(n - kept, kMaxBatch)) * dim);
        std::vector<double> sum(mean ? dim : 0);
        std::vector<float> state(dim); // the pooled token's
        std::vector<BatchToken> batch(hidden.size() / dim);
        for (size_t i = kept; i < n; i += kMaxBatch) {
            const int m = static_cast<int>(std::min<size_t>(kMaxBatch, n - i));
            for (int j = 0; j < m; ++j)
                batch[j] = {&s->kv, ids[i + j], static_cast<int32_t>(i + j), mean || i + j == pooled, &s->rs};
            const std::vector<llmd_session *> owners(m, s);
            advance(e, owners.data(), batch.data(), m, nullptr, hidden.data());
            s->tokens.insert(s->tokens.end(), ids + i, ids + i + m);
            if (mean) {
                for (int j = 0; j < m; ++j)
                    for (int d = 0; d < dim; ++d) sum[d] += hidden[static_cast<size_t>(j) * dim + d];
            } else if (pooled >= i && pooled < i + m) {
                std::copy_n(hidden.data(), dim, state.data());
            }
        }
        if (mean)
            for (int d = 0; d < dim; ++d) state[d] = static_cast<float>(sum[d] / static_cast<double>(n));
        if (rank) classify(head, state.data(), out);
        else std::copy(state.begin(), state.end(), out);
        return LLMD_OK;
    });
}

llmd_status llmd_session_logits(const llmd_session *s, float *out, size_t n) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (out == nullptr || n != s->logits.size())
            return fail(LLMD_ERR_INVALID_ARGUMENT, "logits buffer must hold n_vocab floats");
        if (!s->logits_valid || s->pending >= 0) return fail(LLMD_ERR_STATE, "no logits: prefill first");
        std::copy(s->logits.begin(), s->logits.end(), out);
        return LLMD_OK;
    });
}

llmd_status llmd_session_score(llmd_session *s, const int32_t *ids, size_t n, size_t first, float *logprobs) {
    return llmd_session_score_top(s, ids, n, first, 0, logprobs, nullptr, nullptr);
}

llmd_status llmd_session_score_top(llmd_session *s, const int32_t *ids, size_t n, size_t first, int32_t n_top,
                                   float *logprobs, int32_t *top_ids, float *top_logprobs) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        llmd_engine *e = s->engine;
        if (n < 2 || first >= n - 1 || logprobs == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "score needs n >= 2, first < n - 1 and an output buffer");
        if (const llmd_status st = check_top(n_top, top_ids, top_logprobs); st != LLMD_OK) return st;
        if (const llmd_status st = check_ids(e, ids, n); st != LLMD_OK) return st;
        const size_t pos = s->tokens.size();
        if (n > static_cast<size_t>(e->n_ctx) - pos) return fail(LLMD_ERR_CONTEXT_FULL, "the tokens do not fit the context");
        const int n_vocab = e->model->hp.n_vocab;
        constexpr int kChunk = 64; // bounds the logits buffer to kChunk × n_vocab floats
        std::vector<float> logits(static_cast<size_t>(kChunk) * n_vocab);
        std::vector<BatchToken> batch(kChunk);
        s->pending = -1;
        s->logits_valid = false;
        s->rs.checkpoint(); // as prefill: the end of a reply this continues
        for (size_t i = 0; i < n; i += kChunk) {
            const int m = static_cast<int>(std::min<size_t>(kChunk, n - i));
            for (int j = 0; j < m; ++j) {
                const size_t t = i + j;
                batch[j] = {&s->kv, ids[t], static_cast<int32_t>(pos + t), t >= first, &s->rs};
            }
            const std::vector<llmd_session *> owners(m, s);
            advance(e, owners.data(), batch.data(), m, logits.data());
            s->tokens.insert(s->tokens.end(), ids + i, ids + i + m);
            s->kv.publish(s->tokens);
            int row = 0;
            for (int j = 0; j < m; ++j) {
                if (!batch[j].logits) continue;
                const float *l = logits.data() + static_cast<size_t>(row++) * n_vocab;
                if (i + j + 1 == n) { // the last token's: the next-token logits, as prefill leaves them
                    std::copy_n(l, n_vocab, s->logits.data());
                    continue;
                }
                const size_t k = i + j - first;
                logprobs[k] = log_softmax_top(l, n_vocab, ids[i + j + 1], n_top, top_ids + k * n_top,
                                              top_logprobs + k * n_top);
            }
        }
        s->rs.checkpoint();
        s->logits_valid = true;
        return LLMD_OK;
    });
}

llmd_status llmd_session_token_logprobs(const llmd_session *s, int32_t n_top, float *logprob, int32_t *top_ids,
                                        float *top_logprobs) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (logprob == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "logprob must not be null");
        if (const llmd_status st = check_top(n_top, top_ids, top_logprobs); st != LLMD_OK) return st;
        if (s->pending < 0 || !s->logits_valid) return fail(LLMD_ERR_STATE, "no sampled token: decode first");
        *logprob = log_softmax_top(s->logits.data(), static_cast<int>(s->logits.size()), s->pending, n_top, top_ids,
                                   top_logprobs);
        return LLMD_OK;
    });
}

} // extern "C"
