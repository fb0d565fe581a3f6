// kvcache.cpp — see kvcache.h: the layers' places, positions allocated, truncated,
// published to the prefix cache and adopted from it.
#include "memory/kvcache.h"

#include <algorithm>
#include <stdexcept>

namespace llmd {

std::vector<KVCache::Layer> KVCache::layout(const HParams &hp, int n_ctx, size_t *ring_elements,
                                            size_t *block_elements) {
    const auto blocks = [](int64_t n) { return static_cast<int>((n + kKeyBlock - 1) / kKeyBlock * kKeyBlock); };
    std::vector<Layer> layers(hp.n_layer);
    size_t offset = 0;
    int paged = 0;
    for (int l = 0; l < hp.n_layer; ++l) {
        // A forward batch writes all its positions before any of them attends, so a
        // ring holds its window behind the batch's first position plus the batch.
        const int w = hp.window[l];
        const int slots = w > 0 ? std::min(blocks(n_ctx), blocks(int64_t{w} + kMaxBatch - 1)) : 0;
        if (hp.recurrent(l)) { // keeps a recurrent state (recurrent.h), no keys and values
            layers[l] = {0, 0, 0};
        } else if (w > 0 && slots < blocks(n_ctx)) {
            layers[l] = {offset, slots, w};
            offset += static_cast<size_t>(slots) * hp.kv_dim();
        } else { // a window as long as the context attends everything a ring would hold
            layers[l] = {0, 0, w, paged++};
        }
    }
    *ring_elements = offset;
    *block_elements = static_cast<size_t>(paged) * hp.kv_dim() * kKVBlock;
    return layers;
}

uint64_t KVCache::bytes_per_token(const HParams &hp, int n_ctx) {
    size_t ring = 0, block = 0;
    layout(hp, n_ctx, &ring, &block);
    return 2ull * block / kKVBlock * sizeof(uint16_t);
}

uint64_t KVCache::ring_bytes(const HParams &hp, int n_ctx) {
    size_t elements = 0, block = 0;
    layout(hp, n_ctx, &elements, &block);
    return 2ull * elements * sizeof(uint16_t);
}

int KVCache::resume_floor() const {
    int floor = 0;
    for (const Layer &L : layers) {
        const int held = held_from(L); // positions below this one were overwritten, or never written
        if (L.paged < 0 && L.window > 0 && held > 0) floor = std::max(floor, held + L.window - 1); // a ring
    }
    return floor;
}

void KVCache::copy_rings(const HParams &hp, const KVCache &from, int begin, int end) {
    const int hd = hp.head_dim;
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
        if (layers[l].paged >= 0 || layers[l].slots == 0) continue;
        for (int h = 0; h < hp.n_head_kv; ++h)
            for (int p = begin; p < end; ++p) {
                const Row src = from.row(hp, l, h, p), dst = row(hp, l, h, p);
                for (int d = 0; d < hd; ++d) dst.keys[key_at(dst.index, d, hd)] = src.keys[key_at(src.index, d, hd)];
                std::copy_n(src.values + static_cast<size_t>(src.index) * hd, hd,
                            dst.values + static_cast<size_t>(dst.index) * hd);
            }
    }
}

void KVCache::prepare(int pos) {
    if (pool == nullptr || pool->runs() == 0) return;
    const size_t b = static_cast<size_t>(pos / kKVBlock);
    if (b >= blocks.size()) {
        blocks.reserve(b + 1); // so that no push_back throws with a block acquired
        while (blocks.size() <= b) blocks.push_back(pool->acquire(blocks.empty() ? -1 : blocks.back()));
    } else if (pool->published(blocks[b])) { // immutable: write on a copy
        const int copy = pool->acquire(b > 0 ? blocks[b - 1] : -1);
        pool->copy(copy, blocks[b], kKVBlock);
        pool->release(blocks[b]);
        blocks[b] = copy;
        published = std::min(published, static_cast<int>(b));
    }
}

void KVCache::truncate(int pos) {
    if (pos == 0) {
        high = -1;
        ring_low = 0;
        foreign = false;
    }
    const size_t keep = static_cast<size_t>((pos + kKVBlock - 1) / kKVBlock);
    while (blocks.size() > keep) { // the last first: a retired parent outlives its children
        pool->release(blocks.back());
        blocks.pop_back();
    }
    published = std::min(published, pos / kKVBlock);
}

void KVCache::publish(const std::vector<int32_t> &tokens) {
    if (!sharing || foreign) return;
    const int full = static_cast<int>(tokens.size()) / kKVBlock;
    for (; published < full; ++published) {
        const int i = published, parent = i > 0 ? blocks[i - 1] : -1;
        if (parent >= 0 && !pool->published(parent)) return; // the chain stopped before it
        const int held = pool->publish(blocks[i], parent, scope, tokens.data() + static_cast<size_t>(i) * kKVBlock);
        if (held < 0) return;
        if (held != blocks[i]) { // the same tokens were computed elsewhere: hold that copy
            pool->retain(held);
            pool->release(blocks[i]);
            blocks[i] = held;
        }
    }
}

void KVCache::adopt(const PrefixMatch &m) {
    std::vector<int> next;
    next.reserve(m.blocks.size() + 1);
    for (const int id : m.blocks) {
        pool->retain(id);
        next.push_back(id);
    }
    const size_t i = m.blocks.size();
    if (m.tail_len > 0) {
        if (i < blocks.size() && blocks[i] == m.tail_block && !pool->published(m.tail_block)) {
            pool->retain(m.tail_block); // this session's own block: kept where it is
            next.push_back(m.tail_block);
        } else {
            try {
                next.push_back(pool->acquire(next.empty() ? -1 : next.back()));
            } catch (...) {
                for (const int id : next) pool->release(id);
                throw;
            }
            pool->copy(next.back(), m.tail_block, m.tail_len);
        }
    }
    truncate(0); // which also ends `foreign`: the blocks matched are the scope's own
    blocks = std::move(next);
    high = m.length() - 1;
    published = static_cast<int>(m.blocks.size());
}

} // namespace llmd
