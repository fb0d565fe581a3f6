// engine.cpp — the C ABI of llmd.h for engines: opening a GGUF (its vocabulary,
// weights, KV pool and capacity), what it reports, tokenizing, the bandwidth probe;
// and the definitions handles.h shares with the other entry points.
#include "abi/handles.h"

#include "arch/arch.h"
#include "kernels/kernels.h"
#include "runtime/bandwidth.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

using namespace llmd;
using namespace llmd::abi;

namespace llmd::abi {

thread_local std::string g_error;
std::mutex g_live_mutex;
std::unordered_set<const llmd_session *> g_live;

llmd_status fail(llmd_status status, std::string message) {
    g_error = std::move(message);
    return status;
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

llmd_status check_weights(const llmd_engine *e) {
    if (!e->model)
        return fail(LLMD_ERR_UNSUPPORTED, "this GGUF holds only a vocabulary: it can tokenize, not generate");
    return LLMD_OK;
}

int pool_threads(int n) { return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

llmd_status check_threads(int n) {
    constexpr int kMaxThreads = 256;
    if (pool_threads(n) <= kMaxThreads) return LLMD_OK;
    return fail(LLMD_ERR_INVALID_ARGUMENT, "n_threads is too large (at most " + std::to_string(kMaxThreads) + ")");
}

std::string family_key(const llmd_engine *e, const char *name) {
    std::string err;
    std::string_view arch;
    e->file->get_string("general.architecture", &arch, &err); // checked when the engine opened
    return std::string(arch) + "." + name;
}

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

} // namespace llmd::abi

namespace {

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
               {"tokenizer.ggml.unknown_token_id", &data.unk},     {"tokenizer.ggml.fim_pre_token_id", &data.fim_pre},
               {"tokenizer.ggml.fim_suf_token_id", &data.fim_suf}, {"tokenizer.ggml.fim_mid_token_id", &data.fim_mid},
               {"tokenizer.ggml.fim_pad_token_id", &data.fim_pad}, {"tokenizer.ggml.fim_rep_token_id", &data.fim_rep},
               {"tokenizer.ggml.fim_sep_token_id", &data.fim_sep},
               // older files (CodeLlama's) name the markers so; as in llama.cpp, these win
               {"tokenizer.ggml.prefix_token_id", &data.fim_pre},  {"tokenizer.ggml.suffix_token_id", &data.fim_suf},
               {"tokenizer.ggml.middle_token_id", &data.fim_mid}};
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

int capacity_for(const llmd_engine *e, uint64_t budget) {
    budget -= std::min(budget, e->snapshot_budget); // the prefix cache's recurrent snapshots come first
    const uint64_t n = budget / std::max<uint64_t>(1, e->bytes_per_session());
    return static_cast<int>(std::min<uint64_t>(n, 4096));
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
        for (const auto &[name, type, what] : {std::tuple{opts.kv_type_k, &e->kv_types.k, "keys"},
                                               std::tuple{opts.kv_type_v, &e->kv_types.v, "values"}})
            if (name != nullptr && *name != '\0' && !kv_type_from_name(name, type))
                return fail(LLMD_ERR_INVALID_ARGUMENT, std::string("unknown KV type '") + name + "' for " + what +
                                                           " (allowed: " + kKVTypeNames + ")");
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
        if (e->file->get_string("tokenizer.chat_template.rerank", &sv, &err)) e->rerank_template = sv;
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
        for (const std::string &w : e->model->warnings) e->warnings += (e->warnings.empty() ? "" : "\n") + w;

        const HParams &hp = e->model->hp;
        e->n_ctx = opts.n_ctx > 0 ? opts.n_ctx : std::min(hp.n_ctx_train, 8192);
        if (e->n_ctx > (1 << 20)) return fail(LLMD_ERR_INVALID_ARGUMENT, "n_ctx is too large");
        e->model->use_context(e->n_ctx);
        for (const uint32_t t : {e->kv_types.k, e->kv_types.v})
            for (const int hd : hp.layer_head_dim) // every width the cache keeps
                if (const char *why = nullptr; !kv_type_fits(t, hd, &why))
                    return fail(LLMD_ERR_UNSUPPORTED, std::string("KV type ") + kv_type_name(t) + ": " + why +
                                                          "; this model's is " + std::to_string(hd) +
                                                          " (allowed here: f16)");
        if (opts.draft_nextn != 0 && opts.draft_nextn != 1)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "draft_nextn is 0 or 1");
        if (opts.draft_nextn == 1 && hp.n_layer_nextn == 0)
            return fail(LLMD_ERR_UNSUPPORTED, "this model has no multi-token-prediction block to draft with (its file "
                                              "sets no " + e->architecture + ".nextn_predict_layers)");
        if (opts.draft_nextn == 1 && e->architecture != "qwen35" && e->architecture != "qwen35moe" &&
            e->architecture != "glm4moe")
            return fail(LLMD_ERR_UNSUPPORTED, "drafting with multi-token-prediction blocks is built for qwen35, "
                                              "qwen35moe and glm4moe, not " + e->architecture);
        e->nextn = opts.draft_nextn == 1;
        KVCache::Sizes sizes;
        KVCache::layout(hp, e->cached_blocks(), e->n_ctx, e->kv_types, &sizes);
        // A recurrent model's prefix is its blocks and a snapshot of the state after
        // them; one that also kept sliding-window rings would need both: none does.
        const bool recurrent = RecurrentState::state_bytes(hp) > 0;
        e->kv_shares = sizes.runs > 0 && !(recurrent && sizes.ring_k > 0);
        e->snapshot_budget = e->kv_shares ? RecurrentState::state_bytes(hp) * kSnapshots : 0;
        const uint64_t budget = opts.kv_budget_bytes > 0 ? opts.kv_budget_bytes : physical_memory() / 4;
        e->max_sessions = opts.max_sessions > 0 ? opts.max_sessions : capacity_for(e.get(), budget);
        if (e->max_sessions < 1)
            return fail(LLMD_ERR_CAPACITY, "the KV budget does not fit one session of " + std::to_string(e->n_ctx) + " tokens");
        if (const llmd_status st = check_threads(opts.n_threads); st != LLMD_OK) return st;
        e->pool = std::make_unique<ThreadPool>(pool_threads(opts.n_threads));
        e->ws.reserve(hp, 1);
        const uint64_t retired = opts.prefix_cache_bytes > 0 ? opts.prefix_cache_bytes
                                                             : KVCache::bytes_per_token(hp, e->cached_blocks(), e->n_ctx, e->kv_types) * static_cast<uint64_t>(e->n_ctx);
        e->kv_pool = std::make_unique<KVPool>(sizes.runs, sizes.k_row, sizes.v_row,
                                              (e->n_ctx + kKVBlock - 1) / kKVBlock, fingerprint, retired);
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
        out->rerank_template = e->rerank_template.c_str();
        out->tokenizer_pre = e->tokenizer_pre.c_str();
        out->kernels = kernels().name;
        out->warnings = e->warnings.c_str();
        out->bos_id = e->bos_id;
        out->eos_id = e->eos_id;
        out->add_bos = e->add_bos ? 1 : 0;
        out->add_eos = e->add_eos ? 1 : 0;
        out->n_eog = static_cast<int32_t>(e->eog_ids.size());
        out->eog_ids = e->eog_ids.data();
        const Vocab::Fim &fim = e->vocab->fim();
        out->fim_pre_id = fim.pre;
        out->fim_suf_id = fim.suf;
        out->fim_mid_id = fim.mid;
        out->fim_rep_id = fim.rep;
        out->fim_sep_id = fim.sep;
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
        out->n_labels = static_cast<int32_t>(e->model->classifier.out.rows);
        out->n_layer = hp.n_layer;
        out->n_head = hp.n_head;
        out->n_head_kv = hp.n_head_kv;
        out->n_threads = e->pool->size();
        out->weight_bytes = e->model->weight_bytes;
        out->kv_bytes_per_token = KVCache::bytes_per_token(hp, e->cached_blocks(), e->n_ctx, e->kv_types);
        out->kv_ring_bytes = KVCache::ring_bytes(hp, e->cached_blocks(), e->n_ctx, e->kv_types);
        out->bytes_per_session = e->bytes_per_session();
        out->max_sessions = e->max_sessions;
        out->n_recurrent_layers = static_cast<int32_t>(std::count_if(hp.state.begin(), hp.state.end(), [](int n) { return n > 0; }));
        out->recurrent_bytes = RecurrentState::session_bytes(hp);
        out->kv_type_k = kv_type_name(e->kv_types.k);
        out->kv_type_v = kv_type_name(e->kv_types.v);
        out->kv_block_positions = kKVBlock;
        out->kv_block_bytes = e->kv_pool->block_bytes();
        out->kv_shares_prefixes = e->kv_shares ? 1 : 0;
        out->n_layer_nextn = hp.n_layer_nextn;
        out->draft_nextn = e->nextn ? 1 : 0;
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

llmd_status llmd_engine_pooling_type(const llmd_engine *e, int32_t *pooling_type) {
    return guarded([&]() -> llmd_status {
        if (e == nullptr || pooling_type == nullptr) return fail(LLMD_ERR_INVALID_ARGUMENT, "engine and out must not be null");
        return read_pooling(e, pooling_type);
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

} // extern "C"
