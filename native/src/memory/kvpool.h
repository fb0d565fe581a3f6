// kvpool.h — the paged attention memory of an engine: blocks of kKVBlock positions
// that sessions hold through block tables (KVCache::blocks, kvcache.h), with reference
// counts, and the prefix index that lets a session reuse another's blocks.
//
// Theory of operation. A block holds the keys and values of kKVBlock consecutive
// positions of every layer that attends all positions. A session writes only blocks
// it alone holds; a full block may be published: content-addressed by a chain key
// over (model fingerprint, scope, every token id up to the block's end), it becomes
// immutable, and any session of the same scope whose prompt starts with those tokens
// may hold it too. The key only finds a candidate; a match is exact: the block's
// scope and tokens equal the prompt's and its parent (the block before it) is the
// very block already matched, by a serial number that is never reused, so a hit
// returns exactly the KV a fresh prefill of those tokens computes (prefill is
// chunk- and batch-invariant, attention.h). Writing into a published block (after a
// truncate into it) copies it first. A published block nobody holds is retired: kept,
// least recently released first out, while the retired blocks fit the budget.
// Sliding-window layers keep rings, not blocks (kvcache.h: KVCache): a prefix of such a
// model is reused only with a copy of the rings of a live session that still holds
// its window (llmd_session_share_prefix).
//
// Placement. A block is kept as runs, one per (paged layer, KV head): that head's
// keys (and values) of the block's kKVBlock positions in the engine's KV types
// (attention.h: KVTypes), the unit attention reads. The pool's memory comes in slabs
// of blocks, laid out run-major: the slab's blocks' runs of one head lie next to each
// other, block after block, the keys' runs first, then the values'. A quantized
// block is smaller, and the prefix cache shares it as it is. A session's next block goes
// right behind its previous one when that slot is free, so one head's history is a
// single stretch of memory (as in a contiguous cache) and the hardware's prefetchers,
// which follow streams, cross from block to block without restarting.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmd {

// Positions per block: the fast attention kernel's block of positions (attention.cpp),
// so that a range of kAttnRange positions is four whole runs for it, and sessions that
// share a prompt differ by at most one partly filled block each.
constexpr int kKVBlock = 64;

// Most blocks per slab: 4096 positions, beyond which a jump from slab to slab every
// few hundred kilobytes of a head's history costs the prefetchers little.
constexpr int kMaxSlabBlocks = 64;

struct KVCache; // kvcache.h

// The full blocks of a prompt's longest cached prefix, and the block whose first
// tail_len positions hold the rest of it (copied, never shared: the tail is written on).
struct PrefixMatch {
    std::vector<int> blocks;
    int tail_block = -1;
    int tail_len = 0;
    int length() const { return static_cast<int>(blocks.size()) * kKVBlock + tail_len; }
    // Keeps only the first n <= length() positions: a block cut short becomes the tail.
    void trim(int n) {
        if (n >= static_cast<int>(blocks.size()) * kKVBlock) {
            tail_len = n - static_cast<int>(blocks.size()) * kKVBlock;
            if (tail_len == 0) tail_block = -1;
            return;
        }
        const size_t full = static_cast<size_t>(n / kKVBlock);
        tail_len = n % kKVBlock;
        tail_block = tail_len > 0 ? blocks[full] : -1;
        blocks.resize(full);
    }
};

// A session that may lend its partly filled block: its cache and the ids in it.
struct PrefixHolder {
    const KVCache *kv;
    const std::vector<int32_t> *tokens;
};

class KVPool {
public:
    // `runs`: runs of a block (paged layers times KV heads); a run holds kKVBlock
    // positions of one head's keys of `k_row` bytes each (and values of `v_row`,
    // attention.h: kv_row_bytes); `slab_blocks`:
    // blocks per slab, at most kMaxSlabBlocks (a context's worth suits: a session's
    // blocks then fit one slab);
    // `fingerprint`: the model's, the start of every chain key; `retired_budget`:
    // bytes of retired blocks kept.
    KVPool(size_t runs, size_t k_row, size_t v_row, int slab_blocks, uint64_t fingerprint, uint64_t retired_budget);

    size_t runs() const { return runs_; }
    uint64_t block_bytes() const { return runs_ * (k_run_ + v_run_); }

    // A new private block, held once, behind block `after` (the session's previous
    // one, -1 for its first) where that slot is free; throws bad_alloc.
    int acquire(int after);
    void retain(int id);
    void release(int id);   // the last release frees the block, or retires a published one
    // Run `run` of block `id`: keys in key blocks (attention.h), values as rows.
    uint8_t *keys(int id, size_t run) const { return blocks_[id].k + run * slab_blocks_ * k_run_; }
    uint8_t *values(int id, size_t run) const { return blocks_[id].v + run * slab_blocks_ * v_run_; }
    // Copies the first n_pos positions of every run of block `from` into block `to`.
    void copy(int to, int from, int n_pos);
    bool published(int id) const { return blocks_[id].serial != 0; }
    // A published block's serial number (never reused; 0 for a private block): what
    // names the prefix ending at it (recurrent.h: SnapshotCache).
    uint64_t serial(int id) const { return blocks_[id].serial; }

    // Publishes block `id` of a session, full with `tokens` (kKVBlock ids) after
    // `parent` (the published block before it, -1 for the first) in `scope`. Returns
    // the block that holds this content from now on: `id` itself, an equal block
    // published earlier (the caller holds that one instead), or -1 when the chain key
    // is taken by other content (nothing published; the chain stops there).
    int publish(int id, int parent, const std::string &scope, const int32_t *tokens);

    // The longest prefix of ids[0, limit) that the scope's published blocks chain, then
    // the holder whose block after them shares the most further ids.
    PrefixMatch match(const std::string &scope, const int32_t *ids, int limit,
                      const std::vector<PrefixHolder> &holders) const;

    // Any thread may read these (metrics).
    int64_t live() const { return live_.load(); }       // blocks held by sessions
    int64_t retired() const { return retired_.load(); } // published blocks nobody holds
    int64_t refs() const { return refs_.load(); }       // holds over all live blocks

private:
    struct Block {
        uint8_t *k = nullptr, *v = nullptr; // its run 0's keys and values in its slab, while in use
        int refs = 0;
        uint64_t serial = 0; // published: never reused; 0: private
        uint64_t parent = 0; // the parent's serial (0: the first block of its sequence)
        uint64_t key = 0;
        std::string scope;
        std::vector<int32_t> tokens;
        std::list<int>::iterator retired; // its place in retired_lru_ while retired
    };
    uint64_t chain_key(uint64_t parent_key, const int32_t *tokens) const;
    uint64_t scope_key(const std::string &scope) const;
    int find(uint64_t key, uint64_t parent_serial, const std::string &scope, const int32_t *tokens) const;
    void free_block(int id);
    int free_slot(int after) const;
    struct Slab {
        // Laid out (runs, slab blocks, k_run) for the keys, then (runs, slab blocks, v_run)
        // for the values; null while no block of it is in use.
        std::unique_ptr<uint8_t, void (*)(void *)> data{nullptr, std::free};
        int used = 0;
    };
    size_t runs_;
    size_t k_run_, v_run_; // bytes of a run's keys and values
    size_t slab_blocks_;
    uint64_t fingerprint_;
    uint64_t retired_max_; // blocks
    uint64_t next_serial_ = 1;
    std::vector<Block> blocks_; // slab s holds blocks [s * slab_blocks_, (s + 1) * slab_blocks_)
    std::vector<Slab> slabs_;
    std::set<int> free_ids_;   // in order: runs of free slots are runs of ids
    std::unordered_map<uint64_t, int> index_; // chain key -> published block
    std::list<int> retired_lru_;              // most recently retired first
    std::atomic<int64_t> live_{0}, retired_{0}, refs_{0};
};

} // namespace llmd
