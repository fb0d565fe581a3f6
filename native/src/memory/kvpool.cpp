// kvpool.cpp — see kvpool.h.
#include "memory/kvpool.h"

#include "ops/attention.h"
#include "memory/kvcache.h"
#include "model/model.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace llmd {

namespace {

uint64_t mix(uint64_t h, uint64_t x) { // splitmix64's finaliser over h ^ x
    uint64_t z = h ^ (x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

} // namespace

KVPool::KVPool(size_t runs, size_t k_row, size_t v_row, int slab_blocks, uint64_t fingerprint,
               uint64_t retired_budget)
    : runs_(runs), k_run_(kKVBlock * k_row), v_run_(kKVBlock * v_row),
      slab_blocks_(static_cast<size_t>(std::clamp(slab_blocks, 1, kMaxSlabBlocks))), fingerprint_(fingerprint),
      retired_max_(block_bytes() > 0 ? retired_budget / block_bytes() : 0) {}

int KVPool::free_slot(int after) const {
    const int per_slab = static_cast<int>(slab_blocks_);
    if (after >= 0 && (after + 1) % per_slab != 0 && free_ids_.count(after + 1) != 0) return after + 1;
    // Else the longest run of free slots inside one slab: from its start when it starts
    // the slab or follows a retired block (which no session grows from), else from its
    // middle, leaving the session whose block precedes it room to grow.
    int best = -1, best_len = 0, start = -1, len = 0, prev = -2;
    for (const int id : free_ids_) {
        if (id == prev + 1 && id % per_slab != 0) {
            ++len;
        } else {
            start = id;
            len = 1;
        }
        if (len > best_len) {
            best = start;
            best_len = len;
        }
        prev = id;
    }
    if (best < 0 || best % per_slab == 0 || blocks_[best - 1].refs == 0) return best;
    return best + best_len / 2;
}

int KVPool::acquire(int after) {
    int id = free_slot(after);
    if (id < 0) { // every slab in use: one more
        const size_t first = blocks_.size(), slabs = slabs_.size();
        try {
            blocks_.resize(first + slab_blocks_);
            slabs_.resize(slabs + 1);
            for (size_t i = 0; i < slab_blocks_; ++i) free_ids_.insert(static_cast<int>(first + i));
        } catch (...) {
            free_ids_.erase(free_ids_.lower_bound(static_cast<int>(first)), free_ids_.end());
            slabs_.resize(slabs);
            blocks_.resize(first);
            throw;
        }
        id = static_cast<int>(first);
    }
    Slab &slab = slabs_[static_cast<size_t>(id) / slab_blocks_];
    if (slab.data == nullptr) {
        // Uninitialised on purpose: pages are touched only as positions fill.
        void *p = nullptr;
        if (posix_memalign(&p, 4096, slab_blocks_ * block_bytes()) != 0) throw std::bad_alloc();
        slab.data.reset(static_cast<uint8_t *>(p));
    }
    free_ids_.erase(id);
    ++slab.used;
    const size_t slot = static_cast<size_t>(id) % slab_blocks_;
    blocks_[id].k = slab.data.get() + slot * k_run_;
    blocks_[id].v = slab.data.get() + runs_ * slab_blocks_ * k_run_ + slot * v_run_;
    blocks_[id].refs = 1;
    ++live_;
    ++refs_;
    return id;
}

void KVPool::copy(int to, int from, int n_pos) {
    const size_t key_bytes = static_cast<size_t>((n_pos + kKeyBlock - 1) / kKeyBlock * kKeyBlock) * (k_run_ / kKVBlock);
    for (size_t r = 0; r < runs_; ++r) {
        std::memcpy(keys(to, r), keys(from, r), key_bytes);
        std::memcpy(values(to, r), values(from, r), static_cast<size_t>(n_pos) * (v_run_ / kKVBlock));
    }
}

void KVPool::retain(int id) {
    Block &b = blocks_[id];
    if (b.refs == 0) { // a retired block comes back
        retired_lru_.erase(b.retired);
        --retired_;
        ++live_;
    }
    ++b.refs;
    ++refs_;
}

void KVPool::release(int id) {
    Block &b = blocks_[id];
    --refs_;
    if (--b.refs > 0) return;
    --live_;
    if (b.serial == 0 || retired_max_ == 0) return free_block(id);
    retired_lru_.push_front(id);
    b.retired = retired_lru_.begin();
    ++retired_;
    while (static_cast<uint64_t>(retired_lru_.size()) > retired_max_) {
        const int oldest = retired_lru_.back();
        retired_lru_.pop_back();
        --retired_;
        free_block(oldest);
    }
}

void KVPool::free_block(int id) {
    Block &b = blocks_[id];
    if (b.serial != 0) {
        const auto it = index_.find(b.key);
        if (it != index_.end() && it->second == id) index_.erase(it);
    }
    b = Block{};
    free_ids_.insert(id);
    Slab &slab = slabs_[static_cast<size_t>(id) / slab_blocks_];
    if (--slab.used == 0) slab.data.reset();
}

uint64_t KVPool::scope_key(const std::string &scope) const {
    uint64_t h = mix(fingerprint_, scope.size());
    for (const unsigned char c : scope) h = mix(h, c);
    return h;
}

uint64_t KVPool::chain_key(uint64_t parent_key, const int32_t *tokens) const {
    uint64_t h = parent_key;
    for (int i = 0; i < kKVBlock; ++i) h = mix(h, static_cast<uint32_t>(tokens[i]));
    return h;
}

int KVPool::find(uint64_t key, uint64_t parent_serial, const std::string &scope, const int32_t *tokens) const {
    const auto it = index_.find(key);
    if (it == index_.end()) return -1;
    const Block &b = blocks_[it->second];
    const bool same = b.parent == parent_serial && b.scope == scope &&
                      std::equal(b.tokens.begin(), b.tokens.end(), tokens);
    return same ? it->second : -1;
}

int KVPool::publish(int id, int parent, const std::string &scope, const int32_t *tokens) {
    const uint64_t parent_key = parent >= 0 ? blocks_[parent].key : scope_key(scope);
    const uint64_t parent_serial = parent >= 0 ? blocks_[parent].serial : 0;
    const uint64_t key = chain_key(parent_key, tokens);
    if (const int found = find(key, parent_serial, scope, tokens); found >= 0) return found;
    if (index_.count(key) != 0) return -1; // another content under this key (a 64-bit collision)
    // Everything that can throw first, so a failure leaves the block private.
    std::vector<int32_t> ids(tokens, tokens + kKVBlock);
    std::string owned = scope;
    index_.emplace(key, id);
    Block &b = blocks_[id];
    b.tokens = std::move(ids);
    b.scope = std::move(owned);
    b.key = key;
    b.parent = parent_serial;
    b.serial = next_serial_++;
    return id;
}

PrefixMatch KVPool::match(const std::string &scope, const int32_t *ids, int limit,
                          const std::vector<PrefixHolder> &holders) const {
    PrefixMatch m;
    uint64_t key = scope_key(scope), serial = 0;
    for (int end = kKVBlock; end <= limit; end += kKVBlock) {
        const int32_t *tokens = ids + end - kKVBlock;
        key = chain_key(key, tokens);
        const int id = find(key, serial, scope, tokens);
        if (id < 0) break;
        m.blocks.push_back(id);
        serial = blocks_[id].serial;
    }
    // A holder continues the matched blocks when it holds the last of them at the same
    // place (a published block is reached only through its exact prefix).
    const size_t i = m.blocks.size();
    const int start = static_cast<int>(i) * kKVBlock;
    for (const PrefixHolder &h : holders) {
        const std::vector<int> &table = h.kv->blocks;
        if (table.size() <= i || static_cast<int>(h.tokens->size()) <= start) continue;
        if (i > 0 && table[i - 1] != m.blocks[i - 1]) continue;
        const int end = std::min({limit, start + kKVBlock, static_cast<int>(h.tokens->size())});
        int n = 0;
        while (start + n < end && (*h.tokens)[start + n] == ids[start + n]) ++n;
        if (n > m.tail_len) {
            m.tail_len = n;
            m.tail_block = table[i];
        }
    }
    return m;
}

} // namespace llmd
