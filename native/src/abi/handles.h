// handles.h — what the C ABI's translation units (abi/) share: the engine and session
// behind llmd.h's opaque handles, the error reporting every entry point goes through
// (guarded: no C++ exception crosses the ABI; a failure is a status and a thread-local
// message), and the checks several entry points make. engine.cpp opens engines and
// tokenizes, session.cpp runs sessions, kernels.cpp exposes single kernels for tests.
#pragma once

#include "llmd.h"

#include "decode/grammar.h"
#include "decode/sampler.h"
#include "format/gguf.h"
#include "memory/kvcache.h"
#include "model/model.h"
#include "ops/recurrent.h"
#include "runtime/threadpool.h"
#include "tokenizer/vocab.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

// Recurrent snapshots the prefix cache keeps (a hybrid model's): a conversation leaves
// about two per turn (the end of its prompt and of its reply), of which the newest
// pair is what its next turn resumes from.
constexpr uint64_t kSnapshots = 8;

struct llmd_engine {
    std::unique_ptr<llmd::GGUFFile> file;
    std::unique_ptr<llmd::Vocab> vocab;
    std::unique_ptr<llmd::TokenTrie> trie; // built by the first set_grammar
    std::unique_ptr<llmd::Model> model;
    std::unique_ptr<llmd::ThreadPool> pool;
    llmd::Workspace ws;
    std::string architecture, name, chat_template, tokenizer_pre;
    std::string rerank_template; // tokenizer.chat_template.rerank: a reranker's prompt, "" if none
    std::string warnings; // the model's load warnings (Model::warnings), one a line
    std::vector<int32_t> eog_ids;
    int32_t bos_id = -1, eos_id = -1;
    bool add_bos = false, add_eos = false;
    int n_ctx = 0;
    int max_sessions = 0;
    llmd::KVTypes kv_types; // how sessions' caches store keys and values
    bool nextn = false;     // sessions run the model's first prediction block too (llmd_session_draft_nextn)
    std::unique_ptr<llmd::KVPool> kv_pool;       // before the sessions, whose caches hold its blocks
    bool kv_shares = false;                      // a prefix's KV is its blocks (and a ring's copy, or a recurrent snapshot)
    std::unique_ptr<llmd::SnapshotCache> snapshots; // the recurrent layers' part of the prefix cache
    uint64_t snapshot_budget = 0;                // its bytes: kSnapshots states (counted in capacity)
    std::vector<std::unique_ptr<llmd_session>> sessions;

    // The blocks whose memory sessions keep: the layers, and the prediction block.
    int cached_blocks() const { return model->hp.n_layer + (nextn ? 1 : 0); }
    // Each layer's memory (keys and values per position, a ring, or a recurrent state
    // with its checkpoints), the logits, and the prediction block's input state.
    uint64_t bytes_per_session() const {
        const llmd::HParams &hp = model->hp;
        return llmd::KVCache::bytes_per_token(hp, cached_blocks(), n_ctx, kv_types) * static_cast<uint64_t>(n_ctx) +
               llmd::KVCache::ring_bytes(hp, cached_blocks(), n_ctx, kv_types) +
               llmd::RecurrentState::session_bytes(hp) + static_cast<uint64_t>(hp.n_vocab) * sizeof(float) +
               (nextn ? static_cast<uint64_t>(hp.n_embd) * sizeof(float) : 0);
    }
    bool is_eog(int32_t id) const { return std::find(eog_ids.begin(), eog_ids.end(), id) != eog_ids.end(); }
};

struct llmd_session {
    llmd_engine *engine = nullptr;
    llmd::KVCache kv;
    llmd::RecurrentState rs;     // the recurrent layers' state at position, and its checkpoints
    uint64_t reply_snapshot = 0; // serial of the snapshot this reply's decode published last (0: none)
    std::vector<int32_t> tokens; // ids in the KV cache: tokens.size() == position
    int32_t pending = -1;        // sampled, enters the cache at the next decode step
    std::vector<float> logits;   // next-token logits after tokens (+ nothing pending)
    // With the engine's prediction block: the final-normed hidden state of the last
    // position, which the block pairs with the next token (zeros where unknown: at 0,
    // and after a cut to a position whose state was not kept).
    std::vector<float> nextn_before;
    bool logits_valid = false;
    llmd::Sampler sampler;
    std::unique_ptr<llmd::GrammarMatcher> grammar; // null: unconstrained
    std::atomic<bool> stop{false};
    std::string failure; // why its last step failed (llmd_token.error)
};

namespace llmd::abi {

// The last failure's message on this thread (llmd_last_error).
extern thread_local std::string g_error;

// Records the failure's message for llmd_last_error and returns its status.
llmd_status fail(llmd_status status, std::string message);

// body(), with every exception it throws turned into a status and message.
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

// Handles of live sessions, so a freed or foreign handle is refused, not followed.
extern std::mutex g_live_mutex;
extern std::unordered_set<const llmd_session *> g_live;
bool is_live(const llmd_session *s);
llmd_status check_session(const llmd_session *s);
// Every id inside the vocabulary.
llmd_status check_ids(const llmd_engine *e, const int32_t *ids, size_t n);
// A vocab-only engine (a GGUF without tensors) tokenizes; it has nothing to run.
llmd_status check_weights(const llmd_engine *e);
// Threads of a pool asked for as n: n, or one per core when n is 0.
int pool_threads(int n);
// Refuses a pool of n threads (as pool_threads reads n) past 256.
llmd_status check_threads(int n);
// A metadata key of the model's family as the file names it: "<general.architecture>.<name>".
std::string family_key(const llmd_engine *e, const char *name);
// The file's `<arch>.pooling_type` (0 when it declares none) into *pooling.
llmd_status read_pooling(const llmd_engine *e, int32_t *pooling);

} // namespace llmd::abi
