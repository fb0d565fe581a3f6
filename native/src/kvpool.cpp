// kvpool.cpp — see kvpool.h.
#include "kvpool.h"

#include "model.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <sys/mman.h>

namespace llmd {

namespace {

uint64_t mix(uint64_t h, uint64_t x) { // splitmix64's finaliser over h ^ x
    uint64_t z = h ^ (x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

} // namespace

KVPool::KVPool(size_t elements, uint64_t fingerprint, uint64_t retired_budget)
    : elements_(elements), fingerprint_(fingerprint),
      retired_max_(elements > 0 ? retired_budget / (2 * elements * sizeof(uint16_t)) : 0) {}

int KVPool::acquire() {
    // Uninitialised on purpose: pages are touched only as positions fill. A block of
    // 2 MiB or more starts on a huge page and asks for huge pages: attention jumps from
    // block to block, and with 4 KB pages each jump is a TLB miss (measured: decode of
    // an attention-bound model at 4k positions ~5 % faster).
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t bytes = block_bytes();
    const bool huge = bytes >= kHugePage;
    void *p = nullptr;
    if (posix_memalign(&p, huge ? kHugePage : 64, bytes) != 0) throw std::bad_alloc();
    std::unique_ptr<uint16_t, void (*)(void *)> data(static_cast<uint16_t *>(p), std::free);
    if (huge) madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
    int id;
    if (free_ids_.empty()) {
        blocks_.emplace_back();
        id = static_cast<int>(blocks_.size()) - 1;
    } else {
        id = free_ids_.back();
        free_ids_.pop_back();
    }
    Block &b = blocks_[id];
    b.data = std::move(data);
    b.refs = 1;
    ++live_;
    ++refs_;
    return id;
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
    free_ids_.push_back(id);
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
