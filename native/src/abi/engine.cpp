// engine.cpp — the C ABI of llmd.h: the engine (weights, tokenizer, capacity) and
// its sessions (KV cache, resident ids, sampler). Every entry point catches
// everything, so no exception crosses the ABI; failures become a status and a
// thread-local message.
#include "llmd.h"

#include "arch/arch.h"
#include "runtime/bandwidth.h"
#include "format/gguf.h"
#include "decode/grammar.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "quants/quantize.h"
#include "ops/recurrent.h"
#include "decode/sampler.h"
#include "memory/session_state.h"
#include "tokenizer/vocab.h"

#include <algorithm>
#include <climits>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <new>
#include <string>
#include <thread>
#include <unistd.h>
#include <unordered_set>
#include <vector>

using namespace llmd;

// Recurrent snapshots the prefix cache keeps (a hybrid model's): a conversation leaves
// about two per turn (the end of its prompt and of its reply), of which the newest
// pair is what its next turn resumes from.
constexpr uint64_t kSnapshots = 8;

struct llmd_engine {
    std::unique_ptr<GGUFFile> file;
    std::unique_ptr<Vocab> vocab;
    std::unique_ptr<TokenTrie> trie; // built by the first set_grammar
    std::unique_ptr<Model> model;
    std::unique_ptr<ThreadPool> pool;
    Workspace ws;
    std::string architecture, name, chat_template, tokenizer_pre;
    std::vector<int32_t> eog_ids;
    int32_t bos_id = -1, eos_id = -1;
    bool add_bos = false, add_eos = false;
    int n_ctx = 0;
    int max_sessions = 0;
    std::unique_ptr<KVPool> kv_pool; // before the sessions, whose caches hold its blocks
    bool kv_shares = false;          // a prefix's KV is its blocks (and a ring's copy, or a recurrent snapshot)
    std::unique_ptr<SnapshotCache> snapshots; // the recurrent layers' part of the prefix cache
    uint64_t snapshot_budget = 0;             // its bytes: kSnapshots states (counted in capacity)
    std::vector<std::unique_ptr<llmd_session>> sessions;

    // Each layer's memory (keys and values per position, a ring, or a recurrent state
    // with its checkpoints) and the logits.
    uint64_t bytes_per_session() const {
        return KVCache::bytes_per_token(model->hp, n_ctx) * static_cast<uint64_t>(n_ctx) +
               KVCache::ring_bytes(model->hp, n_ctx) + RecurrentState::session_bytes(model->hp) +
               static_cast<uint64_t>(model->hp.n_vocab) * sizeof(float);
    }
    bool is_eog(int32_t id) const { return std::find(eog_ids.begin(), eog_ids.end(), id) != eog_ids.end(); }
};

struct llmd_session {
    llmd_engine *engine = nullptr;
    KVCache kv;
    RecurrentState rs;           // the recurrent layers' state at position, and its checkpoints
    uint64_t reply_snapshot = 0; // serial of the snapshot this reply's decode published last (0: none)
    std::vector<int32_t> tokens; // ids in the KV cache: tokens.size() == position
    int32_t pending = -1;        // sampled, enters the cache at the next decode step
    std::vector<float> logits;   // next-token logits after tokens (+ nothing pending)
    bool logits_valid = false;
    Sampler sampler;
    std::unique_ptr<GrammarMatcher> grammar; // null: unconstrained
    std::atomic<bool> stop{false};
};

namespace {

thread_local std::string g_error;

// Handles of live sessions, so a freed or foreign handle is refused, not followed.
std::mutex g_live_mutex;
std::unordered_set<const llmd_session *> g_live;

llmd_status fail(llmd_status status, std::string message) {
    g_error = std::move(message);
    return status;
}

template <typename F> llmd_status guarded(F &&body) {
    try {
        g_error.clear();
        return body();
    } catch (const std::bad_alloc &) {
        return fail(LLMD_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return fail(LLMD_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
        return fail(LLMD_ERR_INTERNAL, "internal error");
    }
}

bool is_live(const llmd_session *s) {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    return s != nullptr && g_live.count(s) != 0;
}

llmd_status check_session(const llmd_session *s) {
    if (!is_live(s)) return fail(LLMD_ERR_HANDLE, "session handle is freed or invalid");
    return LLMD_OK;
}

llmd_status check_ids(const llmd_engine *e, const int32_t *ids, size_t n) {
    if (n > 0 && ids == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "token ids are null");
    for (size_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= e->model->hp.n_vocab)
            return fail(LLMD_ERR_TOKEN, "token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                            " is outside the vocabulary (0.." + std::to_string(e->model->hp.n_vocab - 1) + ")");
    return LLMD_OK;
}

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

llmd_status build_vocab(llmd_engine *e) {
    const GGUFFile &f = *e->file;
    VocabData data;
    std::string err;
    std::string_view sv;
    if (f.get_string("tokenizer.ggml.model", &sv, &err)) data.model = sv;
    if (f.get_string("tokenizer.ggml.pre", &sv, &err)) data.pre = sv;
    if (f.get_string("general.name", &sv, &err)) data.name = sv;
    if (!err.empty()) return fail(LLMD_ERR_FORMAT, err);
    if (data.model.empty()) return fail(LLMD_ERR_FORMAT, "GGUF: tokenizer.ggml.model is missing");
    const GGUFKV *tokens = f.find("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->type != GGUF_ARRAY || tokens->arr_type != GGUF_STRING || tokens->arr_count == 0)
        return fail(LLMD_ERR_FORMAT, "GGUF: tokenizer.ggml.tokens is missing or not a string array");
    if (tokens->arr_count > (1u << 24)) return fail(LLMD_ERR_FORMAT, "GGUF: vocabulary is implausibly large");
    for (const auto &t : tokens->arr_strings) data.tokens.emplace_back(t);
    if (const GGUFKV *types = f.find("tokenizer.ggml.token_type")) {
        if (types->type != GGUF_ARRAY || (types->arr_type != GGUF_I32 && types->arr_type != GGUF_U32) ||
            types->arr_count != tokens->arr_count)
            return fail(LLMD_ERR_FORMAT, "GGUF: tokenizer.ggml.token_type does not match the tokens");
        data.types.resize(types->arr_count);
        std::memcpy(data.types.data(), types->arr_data, types->arr_count * 4);
    }
    if (const GGUFKV *scores = f.find("tokenizer.ggml.scores")) {
        if (scores->type != GGUF_ARRAY || scores->arr_type != GGUF_F32 || scores->arr_count != tokens->arr_count)
            return fail(LLMD_ERR_FORMAT, "GGUF: tokenizer.ggml.scores does not match the tokens");
        data.scores.resize(scores->arr_count);
        std::memcpy(data.scores.data(), scores->arr_data, scores->arr_count * 4);
    }
    if (const GGUFKV *merges = f.find("tokenizer.ggml.merges")) {
        if (merges->type != GGUF_ARRAY || merges->arr_type != GGUF_STRING)
            return fail(LLMD_ERR_FORMAT, "GGUF: tokenizer.ggml.merges is not a string array");
        for (const auto &m : merges->arr_strings) data.merges.emplace_back(m);
    }
    // Ids as the file states them; a negative one is out of range like any other,
    // and the Vocab keeps its default then (as llama.cpp does).
    const struct {
        const char *key;
        std::optional<uint32_t> *id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", &data.bos},         {"tokenizer.ggml.eos_token_id", &data.eos},
               {"tokenizer.ggml.eot_token_id", &data.eot},         {"tokenizer.ggml.eom_token_id", &data.eom},
               {"tokenizer.ggml.unknown_token_id", &data.unk},     {"tokenizer.ggml.fim_pad_token_id", &data.fim_pad},
               {"tokenizer.ggml.fim_rep_token_id", &data.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &data.fim_sep}};
    for (const auto &k : ids) {
        int64_t v;
        if (f.get_int(k.key, &v, &err)) *k.id = v >= 0 && v <= INT32_MAX ? uint32_t(v) : UINT32_MAX;
    }
    const struct {
        const char *key;
        std::optional<bool> *flag;
    } flags[] = {{"tokenizer.ggml.add_bos_token", &data.add_bos},
                 {"tokenizer.ggml.add_eos_token", &data.add_eos},
                 {"tokenizer.ggml.add_space_prefix", &data.add_space_prefix}};
    for (const auto &k : flags) {
        bool v;
        if (f.get_bool(k.key, &v, &err)) *k.flag = v;
    }
    if (!err.empty()) return fail(LLMD_ERR_FORMAT, err);
    e->vocab = Vocab::create(std::move(data), &err);
    if (!e->vocab) return fail(LLMD_ERR_UNSUPPORTED, "tokenizer: " + err);
    e->bos_id = e->vocab->bos();
    e->eos_id = e->vocab->eos();
    e->add_bos = e->vocab->add_bos();
    e->add_eos = e->vocab->add_eos();
    e->eog_ids = e->vocab->eog_ids();
    return LLMD_OK;
}

// A vocab-only engine (a GGUF without tensors) tokenizes; it has nothing to run.
llmd_status check_weights(const llmd_engine *e) {
    if (!e->model)
        return fail(LLMD_ERR_UNSUPPORTED, "this GGUF holds only a vocabulary: it can tokenize, not generate");
    return LLMD_OK;
}

uint64_t physical_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : (1ull << 32);
}

// The start of every prefix-cache key (kvpool.h): the tensors' names, types, shapes
// and places, and the first bytes of each, FNV-1a over them.
uint64_t model_fingerprint(const GGUFFile &file) {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto add = [&](const void *data, size_t n) {
        for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t *>(data)[i]) * 0x100000001b3ull;
    };
    for (const GGUFTensor &t : file.tensors()) {
        add(t.name.data(), t.name.size());
        add(&t.type, sizeof t.type);
        add(t.ne, sizeof t.ne);
        add(&t.offset, sizeof t.offset);
        if (t.data != nullptr) add(t.data, std::min<uint64_t>(t.size, 64));
    }
    return h;
}

// How many of the first `end` ids the session's `tokens` begin with.
int common_prefix(const std::vector<int32_t> &tokens, const int32_t *ids, int end) {
    end = std::min(end, static_cast<int>(tokens.size()));
    int n = 0;
    while (n < end && tokens[n] == ids[n]) ++n;
    return n;
}

// Threads of a pool asked for as n: n, or one per core when n is 0.
int pool_threads(int n) { return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// Refuses a pool of n threads (as pool_threads reads n) past 256: far past any machine
// this serves, and short of where starting them could fail half-way.
llmd_status check_threads(int n) {
    constexpr int kMaxThreads = 256;
    if (pool_threads(n) <= kMaxThreads) return LLMD_OK;
    return fail(LLMD_ERR_INVALID_ARGUMENT, "n_threads is too large (at most " + std::to_string(kMaxThreads) + ")");
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
    s->pending = -1;
    s->logits_valid = false;
    s->reply_snapshot = 0;
    *reused = at;
    return LLMD_OK;
}

int capacity_for(const llmd_engine *e, uint64_t budget) {
    budget -= std::min(budget, e->snapshot_budget); // the prefix cache's recurrent snapshots come first
    const uint64_t n = budget / std::max<uint64_t>(1, e->bytes_per_session());
    return static_cast<int>(std::min<uint64_t>(n, 4096));
}

// One decode step for sessions that are live, distinct and of one engine.
llmd_status decode_step(llmd_session *const *sessions, size_t n, llmd_token *out) {
    llmd_engine *e = sessions[0]->engine;
    const HParams &hp = e->model->hp;
    std::vector<BatchToken> batch;
    std::vector<llmd_session *> fed;
    std::vector<char> stopped(n); // decided once, so a stop() racing this step is seen next step
    for (size_t i = 0; i < n; ++i) {
        llmd_session *s = sessions[i];
        out[i] = llmd_token{0, "", 0, 0, 0, 1, 0};
        stopped[i] = s->stop.load();
        if (stopped[i]) continue;
        if (s->pending >= 0) {
            if (static_cast<int>(s->tokens.size()) >= e->n_ctx)
                return fail(LLMD_ERR_CONTEXT_FULL, "the context is full (" + std::to_string(e->n_ctx) + " tokens)");
            batch.push_back({&s->kv, s->pending, static_cast<int32_t>(s->tokens.size()), true, &s->rs});
            fed.push_back(s);
        } else if (!s->logits_valid) {
            return fail(LLMD_ERR_STATE, "decode needs a prefill first");
        }
    }
    if (!batch.empty()) {
        std::vector<float> logits(batch.size() * static_cast<size_t>(hp.n_vocab));
        for (size_t b = 0; b < batch.size(); b += kMaxBatch) {
            const int m = static_cast<int>(std::min<size_t>(kMaxBatch, batch.size() - b));
            forward(*e->model, batch.data() + b, m, e->ws, *e->pool, logits.data() + b * hp.n_vocab);
        }
        for (size_t j = 0; j < fed.size(); ++j) {
            llmd_session *s = fed[j];
            s->tokens.push_back(s->pending);
            s->kv.publish(s->tokens);
            // The newest block boundary of a reply is what the next turn can resume
            // from; the one before it, taken by this reply, makes room.
            if (const uint64_t serial = publish_snapshot(s, s->reply_snapshot); serial != 0) s->reply_snapshot = serial;
            s->pending = -1;
            std::copy_n(logits.data() + j * hp.n_vocab, hp.n_vocab, s->logits.data());
            s->logits_valid = true;
        }
    }
    std::vector<float> scratch(hp.n_vocab);
    for (size_t i = 0; i < n; ++i) {
        if (stopped[i]) continue;
        llmd_session *s = sessions[i];
        std::copy(s->logits.begin(), s->logits.end(), scratch.begin());
        bool forced = false;
        const int32_t id = s->sampler.sample(scratch.data(), hp.n_vocab, s->tokens, s->grammar.get(), &forced);
        if (s->grammar && (id < 0 || !s->grammar->error().empty()))
            return fail(LLMD_ERR_STATE, "grammar: " + (id < 0 ? std::string("no token of the vocabulary can continue")
                                                              : s->grammar->error()));
        if (s->grammar) s->grammar->accept(id);
        const bool completed = s->grammar && s->grammar->complete();
        s->pending = id;
        const std::string_view piece = e->vocab->is_control(id) ? std::string_view() : e->vocab->piece(id);
        out[i] = llmd_token{id, piece.data(), piece.size(), id == e->eos_id, e->is_eog(id) || completed, 0, forced};
    }
    return LLMD_OK;
}

} // namespace

extern "C" {

const char *llmd_last_error(void) { return g_error.c_str(); }

llmd_status llmd_engine_open(const char *path, const llmd_engine_options *options, llmd_engine **out) {
    return guarded([&]() -> llmd_status {
        if (path == nullptr || out == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "path and out must not be null");
        *out = nullptr;
        const llmd_engine_options opts = options ? *options : llmd_engine_options{};
        if (opts.n_threads < 0 || opts.n_ctx < 0 || opts.max_sessions < 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "engine options must not be negative");
        auto e = std::make_unique<llmd_engine>();
        std::string err;
        e->file = GGUFFile::open(path, &err);
        if (!e->file) return fail(err.rfind("cannot", 0) == 0 ? LLMD_ERR_IO : LLMD_ERR_FORMAT, err);
        std::string_view arch;
        if (!e->file->get_string("general.architecture", &arch, &err))
            return fail(LLMD_ERR_FORMAT, err.empty() ? "model metadata lacks general.architecture" : err);
        const bool vocab_only = e->file->tensors().empty();
        const Arch *family = find_arch(arch);
        if (family == nullptr && !vocab_only)
            return fail(LLMD_ERR_UNSUPPORTED, "unsupported architecture '" + std::string(arch) +
                                                  "' (llmd runs " + arch_names() + ")");
        if (const llmd_status st = build_vocab(e.get()); st != LLMD_OK) return st;

        std::string_view sv;
        e->architecture = family ? std::string(family->name) : std::string(arch);
        if (e->file->get_string("general.name", &sv, &err)) e->name = sv;
        if (e->file->get_string("tokenizer.chat_template", &sv, &err)) e->chat_template = sv;
        if (e->file->get_string("tokenizer.ggml.pre", &sv, &err)) e->tokenizer_pre = sv;
        if (vocab_only) {
            *out = e.release();
            return LLMD_OK;
        }
        if (std::string refused = unsupported_tensors(*e->file); !refused.empty())
            return fail(LLMD_ERR_UNSUPPORTED, refused);
        if (!choose_kernels(err)) return fail(LLMD_ERR_UNSUPPORTED, err); // before loading packs for them
        const uint64_t fingerprint = model_fingerprint(*e->file); // before loading releases mapped pages
        e->model = Model::load(*e->file, *family, e->vocab->size(), &err);
        if (!e->model) return fail(LLMD_ERR_FORMAT, err);

        const HParams &hp = e->model->hp;
        e->n_ctx = opts.n_ctx > 0 ? opts.n_ctx : std::min(hp.n_ctx_train, 8192);
        if (e->n_ctx > (1 << 20)) return fail(LLMD_ERR_INVALID_ARGUMENT, "n_ctx is too large");
        e->model->use_context(e->n_ctx);
        size_t ring = 0, block = 0;
        KVCache::layout(hp, e->n_ctx, &ring, &block);
        // A recurrent model's prefix is its blocks and a snapshot of the state after
        // them; one that also kept sliding-window rings would need both: none does.
        const bool recurrent = RecurrentState::state_bytes(hp) > 0;
        e->kv_shares = block > 0 && !(recurrent && ring > 0);
        e->snapshot_budget = e->kv_shares ? RecurrentState::state_bytes(hp) * kSnapshots : 0;
        const uint64_t budget = opts.kv_budget_bytes > 0 ? opts.kv_budget_bytes : physical_memory() / 4;
        e->max_sessions = opts.max_sessions > 0 ? opts.max_sessions : capacity_for(e.get(), budget);
        if (e->max_sessions < 1)
            return fail(LLMD_ERR_CAPACITY, "the KV budget does not fit one session of " + std::to_string(e->n_ctx) + " tokens");
        if (const llmd_status st = check_threads(opts.n_threads); st != LLMD_OK) return st;
        e->pool = std::make_unique<ThreadPool>(pool_threads(opts.n_threads));
        e->ws.reserve(hp, 1);
        const uint64_t retired = opts.prefix_cache_bytes > 0 ? opts.prefix_cache_bytes
                                                             : KVCache::bytes_per_token(hp, e->n_ctx) * static_cast<uint64_t>(e->n_ctx);
        const size_t runs = block > 0 ? block / (static_cast<size_t>(kKVBlock) * hp.head_dim) : 0;
        e->kv_pool = std::make_unique<KVPool>(runs, hp.head_dim, (e->n_ctx + kKVBlock - 1) / kKVBlock, fingerprint, retired);
        e->snapshots = std::make_unique<SnapshotCache>(e->snapshot_budget);
        *out = e.release();
        return LLMD_OK;
    });
}

void llmd_engine_free(llmd_engine *engine) {
    if (engine == nullptr) return;
    {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        for (const auto &s : engine->sessions) g_live.erase(s.get());
    }
    delete engine; // its unique_ptrs free sessions, pool, model and mapping
}

llmd_status llmd_engine_get_info(const llmd_engine *e, llmd_engine_info *out) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || out == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "engine and out must not be null");
        *out = llmd_engine_info{};
        out->architecture = e->architecture.c_str();
        out->name = e->name.c_str();
        out->chat_template = e->chat_template.c_str();
        out->tokenizer_pre = e->tokenizer_pre.c_str();
        out->kernels = kernels().name;
        out->bos_id = e->bos_id;
        out->eos_id = e->eos_id;
        out->add_bos = e->add_bos ? 1 : 0;
        out->add_eos = e->add_eos ? 1 : 0;
        out->n_eog = static_cast<int32_t>(e->eog_ids.size());
        out->eog_ids = e->eog_ids.data();
        out->n_vocab = e->vocab->size();
        if (!e->model) {
            out->vocab_only = 1;
            return LLMD_OK;
        }
        const HParams &hp = e->model->hp;
        out->n_vocab = hp.n_vocab;
        out->n_ctx_train = hp.n_ctx_train;
        out->n_ctx = e->n_ctx;
        out->n_embd = hp.n_embd;
        out->n_layer = hp.n_layer;
        out->n_head = hp.n_head;
        out->n_head_kv = hp.n_head_kv;
        out->n_threads = e->pool->size();
        out->weight_bytes = e->model->weight_bytes;
        out->kv_bytes_per_token = KVCache::bytes_per_token(hp, e->n_ctx);
        out->kv_ring_bytes = KVCache::ring_bytes(hp, e->n_ctx);
        out->bytes_per_session = e->bytes_per_session();
        out->max_sessions = e->max_sessions;
        out->n_recurrent_layers = static_cast<int32_t>(std::count_if(hp.state.begin(), hp.state.end(), [](int n) { return n > 0; }));
        out->recurrent_bytes = RecurrentState::session_bytes(hp);
        out->kv_block_positions = kKVBlock;
        out->kv_block_bytes = e->kv_pool->block_bytes();
        out->kv_shares_prefixes = e->kv_shares ? 1 : 0;
        return LLMD_OK;
    });
}

llmd_status llmd_engine_file_layout(const llmd_engine *e, uint64_t *header_bytes, uint64_t *file_bytes) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || header_bytes == nullptr || file_bytes == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        *header_bytes = e->file->data_offset();
        *file_bytes = e->file->file_size();
        return LLMD_OK;
    });
}

llmd_status llmd_engine_live_sessions(const llmd_engine *e, int32_t *n) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || n == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        // Counted from the live-handle set under its lock, not from e->sessions, which
        // only the engine's own thread may read.
        std::lock_guard<std::mutex> lock(g_live_mutex);
        *n = static_cast<int32_t>(std::count_if(g_live.begin(), g_live.end(),
                                                [&](const llmd_session *s) { return s->engine == e; }));
        return LLMD_OK;
    });
}

llmd_status llmd_engine_kv_stats(const llmd_engine *e, llmd_kv_stats *out) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || out == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        if (const llmd_status st = check_weights(e); st != LLMD_OK) return st;
        *out = {e->kv_pool->live(),         e->kv_pool->retired(),  e->kv_pool->refs(),
                e->snapshots->count(),      e->snapshots->bytes(),  static_cast<int64_t>(e->snapshot_budget)};
        return LLMD_OK;
    });
}

llmd_status llmd_engine_capacity(const llmd_engine *e, uint64_t budget_bytes, int32_t *max_sessions,
                                 uint64_t *bytes_per_session) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || max_sessions == nullptr || bytes_per_session == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        if (const llmd_status st = check_weights(e); st != LLMD_OK) return st;
        *max_sessions = capacity_for(e, budget_bytes);
        *bytes_per_session = e->bytes_per_session();
        return LLMD_OK;
    });
}

llmd_status llmd_tokenize(const llmd_engine *e, const char *text, size_t len, int32_t parse_special, int32_t *out,
                          size_t capacity, size_t *n_out) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || n_out == nullptr || (text == nullptr && len > 0) || (out == nullptr && capacity > 0))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        if (len >= kMaxTokenizeBytes)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "text is too long to tokenize (512 MiB or more)");
        std::vector<int32_t> ids;
        if (!e->vocab->tokenize(std::string_view(text ? text : "", len), parse_special != 0, ids))
            return fail(LLMD_ERR_OUT_OF_MEMORY, "out of memory while tokenizing");
        *n_out = ids.size();
        if (ids.size() > capacity) return fail(LLMD_ERR_INVALID_ARGUMENT, "token buffer too small");
        std::copy(ids.begin(), ids.end(), out);
        return LLMD_OK;
    });
}

llmd_status llmd_tokenize_marked(const llmd_engine *e, const char *text, size_t len, const uint64_t *ranges,
                                 size_t n_ranges, int32_t *out, int64_t *offsets, size_t capacity, size_t *n_out) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || n_out == nullptr || (text == nullptr && len > 0) || (ranges == nullptr && n_ranges > 0) ||
            (out == nullptr && capacity > 0))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        if (len >= kMaxTokenizeBytes)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "text is too long to tokenize (512 MiB or more)");
        if (n_ranges > len)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "more marker ranges than bytes of text");
        std::vector<ByteRange> controls(n_ranges);
        for (size_t i = 0; i < n_ranges; ++i) {
            const uint64_t begin = ranges[2 * i], end = ranges[2 * i + 1];
            const uint64_t floor = i == 0 ? 0 : ranges[2 * i - 1];
            if (begin < floor || begin > end || end > len)
                return fail(LLMD_ERR_INVALID_ARGUMENT, "marker range " + std::to_string(i) + " [" +
                                                           std::to_string(begin) + ", " + std::to_string(end) +
                                                           ") is not sorted, or lies outside the text");
            controls[i] = {size_t(begin), size_t(end)};
        }
        std::vector<int32_t> ids;
        std::vector<int64_t> starts;
        if (!e->vocab->tokenize(std::string_view(text ? text : "", len), controls, ids, offsets ? &starts : nullptr))
            return fail(LLMD_ERR_OUT_OF_MEMORY, "out of memory while tokenizing");
        *n_out = ids.size();
        if (ids.size() > capacity) return fail(LLMD_ERR_INVALID_ARGUMENT, "token buffer too small");
        std::copy(ids.begin(), ids.end(), out);
        if (offsets) std::copy(starts.begin(), starts.end(), offsets);
        return LLMD_OK;
    });
}

llmd_status llmd_token_piece(const llmd_engine *e, int32_t id, int32_t special, const char **data, size_t *len) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || data == nullptr || len == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        if (id < 0 || id >= e->vocab->size())
            return fail(LLMD_ERR_TOKEN, "token id " + std::to_string(id) + " is outside the vocabulary");
        const std::string_view piece = (!special && e->vocab->is_control(id)) ? std::string_view() : e->vocab->piece(id);
        *data = piece.data();
        *len = piece.size();
        return LLMD_OK;
    });
}

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
        size_t ring = 0, block = 0;
        s->kv.layers = KVCache::layout(hp, e->n_ctx, &ring, &block);
        s->kv.pool = e->kv_pool.get();
        // Uninitialised on purpose: pages are touched only as positions fill.
        s->kv.k.reset(new (std::nothrow) uint16_t[ring]);
        s->kv.v.reset(new (std::nothrow) uint16_t[ring]);
        if (!s->kv.k || !s->kv.v) return fail(LLMD_ERR_OUT_OF_MEMORY, "out of memory for a KV cache");
        s->rs.init(hp);
        s->logits.resize(hp.n_vocab);
        llmd_sampling greedy{};
        greedy.repeat_penalty = 1.0f;
        greedy.top_p = 1.0f;
        std::string err;
        s->sampler.configure(greedy, hp.n_vocab, &err);
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
            forward(*e->model, batch.data(), static_cast<int>(m), e->ws, *e->pool, s->logits.data());
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
        if (!s->sampler.configure(*sampling, s->engine->model->hp.n_vocab, &err))
            return fail(LLMD_ERR_INVALID_ARGUMENT, err);
        s->stop.store(false);
        return LLMD_OK;
    });
}

llmd_status llmd_session_decode_one(llmd_session *s, llmd_token *out) { return llmd_session_decode_batch(&s, 1, out); }

llmd_status llmd_session_decode_batch(llmd_session *const *sessions, size_t n, llmd_token *out) {
    return guarded([&]() -> llmd_status {
        if (sessions == nullptr || out == nullptr || n == 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "empty batch");
        for (size_t i = 0; i < n; ++i) {
            if (const llmd_status st = check_session(sessions[i]); st != LLMD_OK) return st;
            if (sessions[i]->engine != sessions[0]->engine)
                return fail(LLMD_ERR_INVALID_ARGUMENT, "a batch must use sessions of one engine");
            for (size_t j = 0; j < i; ++j)
                if (sessions[j] == sessions[i]) return fail(LLMD_ERR_INVALID_ARGUMENT, "a session appears twice in a batch");
        }
        return decode_step(sessions, n, out);
    });
}

llmd_status llmd_session_truncate(llmd_session *s, int32_t pos) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        if (pos < 0 || static_cast<size_t>(pos) > s->tokens.size())
            return fail(LLMD_ERR_INVALID_ARGUMENT, "truncate position " + std::to_string(pos) + " is outside 0.." +
                                                       std::to_string(s->tokens.size()));
        const int floor = s->kv.resume_floor();
        if (pos > 0 && pos < floor)
            return fail(LLMD_ERR_INVALID_ARGUMENT,
                        "truncate position " + std::to_string(pos) + " is before " + std::to_string(floor) +
                            ": the sliding-window layers no longer hold the positions it attends (truncate to 0)");
        // A recurrent state cannot be cut back: only to 0, to a checkpoint, or nowhere.
        const bool here = static_cast<size_t>(pos) == s->tokens.size();
        if (!s->rs.empty() && pos > 0 && !here && !s->rs.has_checkpoint(pos)) {
            std::string at;
            for (const auto &c : s->rs.checkpoints) at += (at.empty() ? "" : ", ") + std::to_string(c.pos);
            return fail(LLMD_ERR_STATE, "truncate position " + std::to_string(pos) +
                                            " is not a checkpoint of the recurrent layers' state (they can return to 0, " +
                                            (at.empty() ? "" : at + ", ") + "or stay at " +
                                            std::to_string(s->tokens.size()) + ")");
        }
        s->kv.truncate(pos);
        s->reply_snapshot = 0;
        if (pos == 0) s->rs.reset();
        else if (!here && !s->rs.empty()) s->rs.restore(pos);
        s->tokens.resize(pos);
        s->pending = -1;
        s->logits_valid = false;
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
        const HParams &hp = e->model->hp;
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
            if (rings != &s->kv) s->kv.copy_rings(hp, *rings, ring_begin, m.length()); // its own are in place
            s->kv.ring_low = ring_begin;
        }
        s->tokens.assign(ids, ids + m.length());
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

llmd_status llmd_grammar_match(const char *grammar, size_t grammar_len, const char *text, size_t text_len,
                               int32_t *result) {
    return guarded([&]() -> llmd_status {
        if (grammar == nullptr || result == nullptr || (text == nullptr && text_len > 0))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "null argument");
        std::string err;
        std::unique_ptr<const Grammar> g = Grammar::parse(std::string_view(grammar, grammar_len), &err);
        if (!g) return fail(LLMD_ERR_INVALID_ARGUMENT, "grammar: " + err);
        GrammarMatcher m(std::move(g), nullptr, 0);
        const bool ok = m.accept_bytes(std::string_view(text ? text : "", text_len));
        if (!m.error().empty()) return fail(LLMD_ERR_STATE, "grammar: " + m.error());
        *result = !ok ? 0 : m.complete() ? 3 : m.can_end() ? 2 : 1;
        return LLMD_OK;
    });
}

llmd_status llmd_engine_bandwidth(llmd_engine *e, uint64_t bytes, int32_t passes, uint64_t *bytes_per_token,
                                  double *read_bytes_per_s) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || bytes_per_token == nullptr || read_bytes_per_s == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "engine and outs must not be null");
        if (bytes < (uint64_t{1} << 20) || bytes > (uint64_t{64} << 30))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bandwidth: bytes must be 1 MiB .. 64 GiB");
        if (passes < 1 || passes > 100) return fail(LLMD_ERR_INVALID_ARGUMENT, "bandwidth: passes must be 1 .. 100");
        if (const llmd_status st = check_weights(e); st != LLMD_OK) return st;
        *bytes_per_token = decode_bytes(*e->model);
        *read_bytes_per_s = read_bandwidth(*e->pool, static_cast<size_t>(bytes), passes);
        return LLMD_OK;
    });
}

namespace {

// A metadata key of the model's family as the file names it: "<general.architecture>.<name>".
std::string family_key(const llmd_engine *e, const char *name) {
    std::string err;
    std::string_view arch;
    e->file->get_string("general.architecture", &arch, &err); // checked when the engine opened
    return std::string(arch) + "." + name;
}

// The file's `<arch>.pooling_type` (0 when it declares none) into *pooling.
llmd_status read_pooling(const llmd_engine *e, int32_t *pooling) {
    std::string err;
    int64_t value = 0;
    if (!e->file->get_int(family_key(e, "pooling_type"), &value, &err)) {
        if (!err.empty()) return fail(LLMD_ERR_FORMAT, err);
        value = 0;
    }
    if (value < 0 || value > 4) return fail(LLMD_ERR_FORMAT, "GGUF: pooling_type " + std::to_string(value) + " is unknown");
    *pooling = static_cast<int32_t>(value);
    return LLMD_OK;
}

} // namespace

llmd_status llmd_engine_pooling_type(const llmd_engine *e, int32_t *pooling_type) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || pooling_type == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "engine and out must not be null");
        return read_pooling(e, pooling_type);
    });
}

llmd_status llmd_session_embed(llmd_session *s, const int32_t *ids, size_t n, float *out, size_t n_out) {
    return guarded([&]() -> llmd_status {
        if (const llmd_status st = check_session(s); st != LLMD_OK) return st;
        llmd_engine *e = s->engine;
        const int dim = e->model->hp.n_embd;
        if (n == 0 || out == nullptr || n_out != static_cast<size_t>(dim))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "embed needs at least one token and an output of n_embd floats");
        int32_t pooling = 0;
        if (const llmd_status st = read_pooling(e, &pooling); st != LLMD_OK) return st;
        if (pooling < 1 || pooling > 3)
            return fail(LLMD_ERR_UNSUPPORTED, pooling == 0 ? "the model declares no pooling: it makes no embeddings"
                                                           : "rank pooling (a reranker's classification head) is not supported");
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
        // The input runs from position 0; the cache then holds it, with no logits.
        s->tokens.clear();
        s->kv.high = -1;
        s->rs.reset();
        s->pending = -1;
        s->logits_valid = false;
        const bool mean = pooling == 1;
        const size_t pooled = pooling == 2 ? 0 : n - 1; // the token CLS or LAST pooling takes
        std::vector<float> hidden(static_cast<size_t>(std::min<size_t>(n, kMaxBatch)) * dim);
        std::vector<double> sum(mean ? dim : 0);
        std::vector<BatchToken> batch(std::min<size_t>(n, kMaxBatch));
        for (size_t i = 0; i < n; i += kMaxBatch) {
            const int m = static_cast<int>(std::min<size_t>(kMaxBatch, n - i));
            for (int j = 0; j < m; ++j)
                batch[j] = {&s->kv, ids[i + j], static_cast<int32_t>(i + j), mean || i + j == pooled, &s->rs};
            forward(*e->model, batch.data(), m, e->ws, *e->pool, nullptr, hidden.data());
            s->tokens.insert(s->tokens.end(), ids + i, ids + i + m);
            if (mean) {
                for (int j = 0; j < m; ++j)
                    for (int d = 0; d < dim; ++d) sum[d] += hidden[static_cast<size_t>(j) * dim + d];
            } else if (pooled >= i && pooled < i + m) {
                std::copy_n(hidden.data(), dim, out);
            }
        }
        if (mean)
            for (int d = 0; d < dim; ++d) out[d] = static_cast<float>(sum[d] / static_cast<double>(n));
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
            forward(*e->model, batch.data(), m, e->ws, *e->pool, logits.data());
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

llmd_status llmd_tensor_type(int32_t type, llmd_tensor_type_info *out) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || out == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "unknown tensor type " + std::to_string(type));
        *out = {traits->name, traits->block_elems, traits->block_bytes, traits->activation != Activation::None};
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_dequantize(int32_t type, const void *data, int64_t n, float *out) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || traits->activation == Activation::None)
            return fail(LLMD_ERR_UNSUPPORTED, "unsupported tensor type " +
                                                  (traits != nullptr ? std::string(traits->name) : std::to_string(type)));
        if (data == nullptr || out == nullptr || !type_runs(type, n)) return fail(LLMD_ERR_INVALID_ARGUMENT, "bad dequantize arguments");
        traits->to_float(static_cast<const uint8_t *>(data), out, n);
        return LLMD_OK;
    });
}

llmd_status llmd_quantize_rows(int32_t src_type, const void *src, int64_t rows, int64_t cols, int32_t dst_type,
                               void *dst, int32_t n_threads) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *from = src_type >= 0 ? type_traits(static_cast<uint32_t>(src_type)) : nullptr;
        const TypeTraits *to = dst_type >= 0 ? type_traits(static_cast<uint32_t>(dst_type)) : nullptr;
        if (from == nullptr || from->to_float == nullptr)
            return fail(LLMD_ERR_UNSUPPORTED, "cannot read tensors of type " +
                                                  (from != nullptr ? std::string(from->name) : std::to_string(src_type)));
        if (to == nullptr || to->from_float == nullptr)
            return fail(LLMD_ERR_UNSUPPORTED, "cannot quantize to type " +
                                                  (to != nullptr ? std::string(to->name) : std::to_string(dst_type)));
        if ((rows > 0 && (src == nullptr || dst == nullptr)) || n_threads < 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad quantize arguments");
        if (const llmd_status st = check_threads(n_threads); st != LLMD_OK) return st;
        ThreadPool pool(pool_threads(n_threads));
        const std::string err = convert_rows(static_cast<uint32_t>(src_type), static_cast<const uint8_t *>(src), rows,
                                             cols, static_cast<uint32_t>(dst_type), static_cast<uint8_t *>(dst), pool);
        return err.empty() ? LLMD_OK : fail(LLMD_ERR_INVALID_ARGUMENT, err);
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

int32_t llmd_kernel_variant_count(void) { return kernel_variant_count(); }

llmd_status llmd_kernel_variant(int32_t i, const char **name, int32_t *runs) {
    return guarded([&]() -> llmd_status {
        if (i < 0 || i >= kernel_variant_count() || name == nullptr || runs == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "no kernel variant " + std::to_string(i));
        *name = kernel_variant(i).name;
        *runs = kernel_variant(i).cpu_runs() ? 1 : 0;
        return LLMD_OK;
    });
}

namespace {

// The table a kernel entry point runs: the named variant, or the scalar references
// for NULL. nullptr (the failure recorded) when the CPU cannot run the variant.
const Kernels *kernels_for_test(const char *name) {
    if (name == nullptr) return &kernels_scalar();
    std::string why;
    const Kernels *k = kernels_named(name, why);
    if (k == nullptr) fail(LLMD_ERR_UNSUPPORTED, why);
    return k;
}

} // namespace

llmd_status llmd_kernel_matmul(int32_t type, const void *weights, int32_t rows, int32_t cols, const float *x,
                               int32_t n, float *y, const char *kernels, int32_t packed) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || traits->activation == Activation::None)
            return fail(LLMD_ERR_UNSUPPORTED, "unsupported tensor type " +
                                                  (traits != nullptr ? std::string(traits->name) : std::to_string(type)));
        if (weights == nullptr || x == nullptr || y == nullptr || rows < 1 || n < 1 || !type_runs(type, cols))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad matrix arguments");
        const Kernels *k = kernels_for_test(kernels);
        if (k == nullptr) return LLMD_ERR_UNSUPPORTED;
        const bool quantized = traits->activation != Activation::F32;
        const int64_t nb = cols / QK;
        std::vector<BlockQ8A> xq(quantized ? quantized_blocks(n, cols) : 0);
        if (quantized) quantize_rows(x, n, cols, xq.data());
        const BlockQ8A *xa = quantized ? activations_of(*traits, xq.data(), n, cols) : nullptr;
        const PanelFn panel = packed ? k->panel[type] : nullptr;
        if (panel != nullptr) {
            const int64_t panels = (rows + kPanel - 1) / kPanel;
            AlignedBytes buf(static_cast<size_t>(panels) * panel_bytes(traits->panel, nb));
            pack_rows(type, weights, rows, cols, buf.data);
            panel(buf.data, rows, cols, 0, panels, xa, n, y, rows, false);
            return LLMD_OK;
        }
        const size_t row = row_bytes(type, cols);
        for (int32_t t = 0; t < n; ++t)
            for (int32_t r = 0; r < rows; ++r)
                y[t * rows + r] = k->dot[type](static_cast<const uint8_t *>(weights) + r * row, x + t * cols,
                                               xa != nullptr ? xa + t * nb : nullptr, cols);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_attention(const float *q, int32_t n_q, const uint16_t *k, const uint16_t *v,
                                  int32_t n_pos, int32_t head_dim, int32_t n_ranges, int32_t run, float *out,
                                  const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (q == nullptr || k == nullptr || v == nullptr || out == nullptr || n_q < 1 || n_q > 1024 ||
            n_pos < 1 || head_dim < 1 || head_dim > 1024 || n_ranges < 1 || n_ranges > n_pos || run < 0 ||
            run % kKeyBlock != 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad attention arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        const size_t hd = static_cast<size_t>(head_dim);
        // The caller's keys are rows; the kernels read them in blocks (attention.h),
        // from runs of `run` positions each in a buffer of its own, as pool blocks are.
        const int32_t blocks = (n_pos + kKeyBlock - 1) / kKeyBlock, per_run = run > 0 ? run : blocks * kKeyBlock;
        std::vector<std::vector<uint16_t>> keys, values;
        for (int32_t p = 0; p < n_pos; ++p) {
            const int32_t i = p % per_run;
            if (i == 0) {
                keys.emplace_back(static_cast<size_t>(per_run) * hd);
                values.emplace_back(static_cast<size_t>(per_run) * hd);
            }
            for (int32_t d = 0; d < head_dim; ++d) keys.back()[key_at(i, d, head_dim)] = k[p * hd + d];
            std::copy_n(v + p * hd, hd, &values.back()[i * hd]);
        }
        std::vector<float> part_out(static_cast<size_t>(n_q) * hd);
        std::vector<AttnPartial> part(n_q), acc(n_q);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        attend_start(out, acc.data(), n_q, head_dim);
        for (int32_t r = 0; r < n_ranges; ++r) { // ranges of whole key blocks, some maybe empty
            const auto p0 = static_cast<int32_t>(std::min<int64_t>(n_pos, int64_t{blocks} * r / n_ranges * kKeyBlock));
            const auto p1 = static_cast<int32_t>(std::min<int64_t>(n_pos, int64_t{blocks} * (r + 1) / n_ranges * kKeyBlock));
            if (p1 == p0) continue;
            std::vector<AttnRun> runs;
            for (int32_t p = p0; p < p1;) {
                const int32_t n = std::min(p1 - p, per_run - p % per_run);
                const size_t at = static_cast<size_t>(p % per_run) * hd;
                runs.push_back({keys[p / per_run].data() + at, values[p / per_run].data() + at, n});
                p += n;
            }
            table->attend_range(q, n_q, runs.data(), static_cast<int>(runs.size()), head_dim, scale, part_out.data(),
                                part.data());
            attend_fold(out, acc.data(), part_out.data(), part.data(), n_q, head_dim);
        }
        attend_finish(out, acc.data(), n_q, head_dim);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_delta_scan(float *m, const float *q, const float *k, const float *v, const float *decay,
                                   const float *beta, int32_t n, int32_t hd, float *out, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (m == nullptr || q == nullptr || k == nullptr || v == nullptr || decay == nullptr || beta == nullptr ||
            out == nullptr || n < 1 || hd < 1 || hd > 1024)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad delta scan arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const size_t stride = static_cast<size_t>(hd);
        table->delta_scan(m, {q, k, v, stride, decay, beta, 1, out, stride}, n, hd, scale);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_glu(int32_t gelu, float *gate, const float *up, int64_t n, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (gate == nullptr || up == nullptr || n < 0 || (gelu != 0 && gelu != 1))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad glu arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        table->glu(gelu == 1, gate, up, n);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_rmsnorm(const float *x, const float *weight, int32_t n, float eps, float *out,
                                const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || weight == nullptr || out == nullptr || n < 1 || !(eps >= 0.0f))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad rmsnorm arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        rmsnorm(out, x, weight, n, eps, table->sum_squares);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_to_f16(const float *x, int32_t n, uint16_t *out, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || out == nullptr || n < 0) return fail(LLMD_ERR_INVALID_ARGUMENT, "bad f16 arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        table->to_f16(x, out, n);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_quantize(const float *x, int64_t n, int32_t group, int8_t *qs, float *d, int32_t *sums,
                                 const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || qs == nullptr || d == nullptr || sums == nullptr || (group != QK && group != QK_K) ||
            n < 1 || n % group != 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad quantize arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        std::vector<BlockQ8A> blocks(static_cast<size_t>(n / QK));
        table->quantize_q8a(x, blocks.data(), n, group);
        for (size_t b = 0; b < blocks.size(); ++b) {
            std::copy_n(blocks[b].qs, QK, qs + b * QK);
            d[b] = blocks[b].d;
            sums[2 * b] = blocks[b].sum;
            sums[2 * b + 1] = blocks[b].sum_lo;
        }
        return LLMD_OK;
    });
}

} // extern "C"
