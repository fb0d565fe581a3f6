// kvcache.h — a session's attention memory: where each layer keeps its keys and
// values (a ring, or blocks of the engine's pool), and the prefix sharing over them.
#pragma once

#include "memory/kvpool.h"
#include "model/model.h"
#include "ops/attention.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llmd {

// One session's attention memory: per layer, keys and values in the engine's KV types
// (attention.h: KVTypes), per KV head in runs of positions (row()): keys in key
// blocks inside a run, values as rows, each as wide as the layer's heads. A layer that
// attends every position keeps its positions in the engine's pool (kvpool.h), in blocks
// of kKVBlock that `blocks` lists in order, allocated as positions are written and
// shared with sessions that hold the same tokens (a pool block's runs are as wide as
// the widest paged layer's rows); a sliding-window layer keeps a ring of its own,
// position p in slot p % slots, just large enough for its window and one forward batch.
// A layer that attends an earlier layer's keys and values (HParams::kv_from) has that
// layer's place and keeps nothing of its own.
struct KVCache {
    struct Layer {
        size_t k_at = 0, v_at = 0; // ring: where the layer's rows start in k and in v, in bytes
        int slots = 0;     // ring: a whole number of key blocks; 0 for a paged layer
        int window = 0;    // positions attended, its own included; 0: all
        int paged = -1;    // paged: the layer's first run in a pool block
        int heads = 0;     // KV heads it writes: 0 for a recurrent layer, or one that reads another's
        int hd = 0;        // the width of its heads
        size_t k_row = 0, v_row = 0; // bytes of a row (one position of one head) of its keys and of its values
    };
    // What a layout takes: the rings' bytes of keys and of values, and a pool block's
    // runs (paged layers' KV heads) and their rows' bytes.
    struct Sizes {
        size_t ring_k = 0, ring_v = 0;
        size_t runs = 0, k_row = 0, v_row = 0;
    };
    std::vector<Layer> layers;
    int high = -1; // highest position written since the cache was last emptied
    int ring_low = 0; // the rings hold no position below this one (a prefix copied from another cache starts here)
    KVTypes types;
    std::unique_ptr<uint8_t[]> k; // the rings
    std::unique_ptr<uint8_t[]> v;
    KVPool *pool = nullptr;
    std::vector<int> blocks; // pool blocks of positions [i * kKVBlock, (i + 1) * kKVBlock)
    // The prefix cache (kvpool.h): full blocks are published in `scope` while
    // `sharing`; blocks [0, published) are published or were offered. A cache that
    // still holds tokens computed for another scope is `foreign` until it is emptied:
    // it neither publishes nor lends them, so no scope learns another's prompts.
    bool sharing = false;
    bool foreign = false;
    std::string scope;
    int published = 0;

    KVCache() = default;
    KVCache(const KVCache &) = delete;
    KVCache &operator=(const KVCache &) = delete;
    ~KVCache() { if (pool != nullptr) truncate(0); }

    // The places of blocks [0, n_blocks) for a context of n_ctx (the model's layers,
    // and its prediction block after them where the engine drafts with it), stored as
    // `types`, and the sizes they take.
    static std::vector<Layer> layout(const HParams &hp, int n_blocks, int n_ctx, KVTypes types, Sizes *sizes);
    // Bytes of keys and values per position of the paged layers (those that attend
    // every position, or a window no shorter than n_ctx), and the fixed bytes of the
    // sliding-window layers' rings at n_ctx, stored as `types`.
    static uint64_t bytes_per_token(const HParams &hp, int n_blocks, int n_ctx, KVTypes types);
    static uint64_t ring_bytes(const HParams &hp, int n_blocks, int n_ctx, KVTypes types);

    // Where (layer, kv head, position) is stored: the run of positions holding it, as
    // its keys and values, and its index there: its key in the key block
    // key_block(keys, types.k, index, hd) at index % kKeyBlock, its value row at
    // values + index * v_row, and positions up to the run's `count` follow it
    // contiguously. The one place that maps a position to memory; the block of a
    // paged position must exist (prepare()).
    struct Row {
        uint8_t *keys;
        uint8_t *values;
        int index;
        int count;
    };
    Row row(int layer, int head, int pos) const {
        const Layer &L = layers[layer];
        if (L.paged < 0) {
            const size_t run = static_cast<size_t>(head) * L.slots;
            return {&k[L.k_at + run * L.k_row], &v[L.v_at + run * L.v_row], pos % L.slots, L.slots};
        }
        const int block = blocks[pos / kKVBlock];
        const size_t run = static_cast<size_t>(L.paged) + head;
        return {pool->keys(block, run), pool->values(block, run), pos % kKVBlock, kKVBlock};
    }
    // Stores a position's key and value (the layer's hd floats each) as their types'
    // rows, by the kernels' kv_row, rotated first where the type is quantized
    // (attention.h: kv_rotation): the same bytes whatever else is written with them.
    void write(int layer, int head, int pos, const float *key, const float *value) const;
    // A position's key and value as rows (attention.h), out of the cache and into it.
    void load(int layer, int head, int pos, uint8_t *key, uint8_t *value) const;
    void store(int layer, int head, int pos, const uint8_t *key, const uint8_t *value) const;

    // Makes the block of position pos (the next one written, or one before it after
    // a truncate) this session's own to write: allocated, or copied if published.
    void prepare(int pos);
    // Keeps positions [0, pos): releases the blocks past them; 0 also empties the rings.
    void truncate(int pos);
    // Publishes the full blocks of `tokens` (the ids in this cache) not yet offered.
    void publish(const std::vector<int32_t> &tokens);
    // Replaces the contents with a prefix the pool matched (kvpool.h): its full
    // blocks held, its tail copied into a block of its own.
    void adopt(const PrefixMatch &m);

    // Positions written at or below `high` that a ring has overwritten are gone: the
    // cache can be cut back to 0 or to any position from resume_floor() on, where
    // every ring still holds the window the next position attends.
    int resume_floor() const;
    // The first position layer L still holds (of those up to `high`): 0 for a paged
    // layer; for a ring, the oldest its later writes have not overwritten, from ring_low.
    int held_from(const Layer &L) const {
        return L.paged >= 0 ? 0 : std::max({0, ring_low, high - L.slots + 1});
    }
    bool has_rings() const {
        return std::any_of(layers.begin(), layers.end(), [](const Layer &L) { return L.paged < 0 && L.slots > 0; });
    }
    // Copies positions [begin, end) of every ring from `from`, a cache of the same
    // layout that holds them (begin >= from.held_from of each ring).
    void copy_rings(const KVCache &from, int begin, int end);
};

} // namespace llmd
