// kvcache.cpp — see kvcache.h: the layers' places, positions allocated, truncated,
// published to the prefix cache and adopted from it.
#include "memory/kvcache.h"

#include "kernels/kernels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace llmd {

std::vector<KVCache::Layer> KVCache::layout(const HParams &hp, int n_blocks, int n_ctx, KVTypes types, Sizes *sizes) {
    const auto blocks = [](int64_t n) { return static_cast<int>((n + kKeyBlock - 1) / kKeyBlock * kKeyBlock); };
    std::vector<Layer> layers(n_blocks);
    *sizes = {};
    for (int l = 0; l < n_blocks; ++l) {
        if (hp.recurrent(l)) continue; // keeps a recurrent state (recurrent.h), no keys and values
        if (hp.kv_from[l] != l) { // reads an earlier layer's place, writes nothing
            layers[l] = layers[hp.kv_from[l]];
            layers[l].heads = 0;
            continue;
        }
        Layer &L = layers[l];
        L.heads = hp.kv_heads(l);
        L.hd = hp.hd(l);
        L.k_row = kv_row_bytes(types.k, L.hd);
        L.v_row = kv_row_bytes(types.v, L.hd);
        // A forward batch writes all its positions before any of them attends, so a
        // ring holds its window behind the batch's first position plus the batch.
        L.window = hp.window[l];
        const int slots = L.window > 0 ? std::min(blocks(n_ctx), blocks(int64_t{L.window} + kMaxBatch - 1)) : 0;
        if (L.window > 0 && slots < blocks(n_ctx)) {
            L.slots = slots;
            L.k_at = sizes->ring_k;
            L.v_at = sizes->ring_v;
            sizes->ring_k += static_cast<size_t>(slots) * L.heads * L.k_row;
            sizes->ring_v += static_cast<size_t>(slots) * L.heads * L.v_row;
        } else { // a window as long as the context attends everything a ring would hold
            L.paged = static_cast<int>(sizes->runs);
            sizes->runs += L.heads;
            sizes->k_row = std::max(sizes->k_row, L.k_row);
            sizes->v_row = std::max(sizes->v_row, L.v_row);
        }
    }
    return layers;
}

uint64_t KVCache::bytes_per_token(const HParams &hp, int n_blocks, int n_ctx, KVTypes types) {
    Sizes sizes;
    layout(hp, n_blocks, n_ctx, types, &sizes);
    return sizes.runs * (sizes.k_row + sizes.v_row);
}

uint64_t KVCache::ring_bytes(const HParams &hp, int n_blocks, int n_ctx, KVTypes types) {
    Sizes sizes;
    layout(hp, n_blocks, n_ctx, types, &sizes);
    return sizes.ring_k + sizes.ring_v;
}

void KVCache::write(int layer, int head, int pos, const float *key, const float *value) const {
    const Layer &L = layers[layer];
    const int hd = L.hd;
    const Row r = row(layer, head, pos);
    const auto kv_row = kernels().kv_row;
    if (types.k == GGML_F16) { // straight into the key block, element by element
        uint16_t *kb = reinterpret_cast<uint16_t *>(r.keys);
        for (int d = 0; d < hd; ++d) kb[key_at(r.index, d, hd)] = fp32_to_fp16(key[d]);
    } else { // rotated (attention.h), quantized as a row, then into its key block
        thread_local std::vector<float> rotated;
        thread_local std::vector<uint8_t> quantized;
        rotated.assign(key, key + hd);
        kv_rotate(rotated.data(), hd, kv_rotation(types.k, hd, true));
        quantized.resize(L.k_row);
        kv_row(types.k, rotated.data(), quantized.data(), hd);
        key_store(types.k, quantized.data(), key_block(r.keys, types.k, r.index, hd), r.index % kKeyBlock, hd);
    }
    if (const int n = kv_rotation(types.v, hd, false); n > 0) {
        thread_local std::vector<float> rotated;
        rotated.assign(value, value + hd);
        kv_rotate(rotated.data(), hd, n);
        kv_row(types.v, rotated.data(), r.values + r.index * L.v_row, hd);
    } else {
        kv_row(types.v, value, r.values + r.index * L.v_row, hd);
    }
}

void KVCache::load(int layer, int head, int pos, uint8_t *key, uint8_t *value) const {
    const Layer &L = layers[layer];
    const Row r = row(layer, head, pos);
    key_load(types.k, key_block(r.keys, types.k, r.index, L.hd), r.index % kKeyBlock, L.hd, key);
    std::memcpy(value, r.values + r.index * L.v_row, L.v_row);
}

void KVCache::store(int layer, int head, int pos, const uint8_t *key, const uint8_t *value) const {
    const Layer &L = layers[layer];
    const Row r = row(layer, head, pos);
    key_store(types.k, key, key_block(r.keys, types.k, r.index, L.hd), r.index % kKeyBlock, L.hd);
    std::memcpy(r.values + r.index * L.v_row, value, L.v_row);
}

int KVCache::resume_floor() const {
    int floor = 0;
    for (const Layer &L : layers) {
        const int held = held_from(L); // positions below this one were overwritten, or never written
        if (L.paged < 0 && L.window > 0 && held > 0) floor = std::max(floor, held + L.window - 1); // a ring
    }
    return floor;
}

void KVCache::copy_rings(const KVCache &from, int begin, int end) {
    std::vector<uint8_t> key, value;
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
        const Layer &L = layers[l];
        if (L.paged >= 0 || L.slots == 0) continue;
        key.resize(L.k_row);
        value.resize(L.v_row);
        for (int h = 0; h < L.heads; ++h)
            for (int p = begin; p < end; ++p) {
                from.load(l, h, p, key.data(), value.data());
                store(l, h, p, key.data(), value.data());
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
