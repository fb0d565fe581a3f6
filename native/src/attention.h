// attention.h — causal attention for one token: the query heads that share a KV
// head, over a range of its session's cached positions.
//
// A range yields a partial result (the streaming, "online" softmax): the running
// max of its scores, the sum of exp(score - max), and the unnormalised output
// sum of exp(score - max) * v. Partials of adjacent ranges combine exactly, so one
// long context can be split across threads. Each kernel has a scalar reference
// (`*_ref`); tests compare them through llmd_kernel_attention.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmd {

constexpr int kMaxGroup = 16; // query heads per KV head of the fast kernel; wider groups use the reference

// Keys are stored in blocks of kKeyBlock positions, dimension-major inside a block:
// element d of position p is at k[key_at(p, d, hd)]. One load then holds a
// dimension of 16 keys, so 16 scores build up in one register without any
// horizontal sum. A range of positions starts at a block boundary.
constexpr int kKeyBlock = 16;
inline size_t key_at(int p, int d, int hd) {
    return static_cast<size_t>(p - p % kKeyBlock) * hd + static_cast<size_t>(d) * kKeyBlock + p % kKeyBlock;
}

struct AttnPartial {
    float max; // largest score seen (-inf for an empty range)
    float sum; // sum of exp(score - max)
};

// q: (n_q, hd) queries; k: n_pos keys of f16 in blocks (key_at); v: n_pos rows of hd
// f16. Writes out (n_q, hd) = sum over positions of exp(scale * q·k - max) * v, and
// part (n_q). The fast kernel may read the unwritten rest of the last key block.
void attend_range(const float *q, int n_q, const uint16_t *k, const uint16_t *v, int n_pos, int hd, float scale,
                  float *out, AttnPartial *part);
void attend_range_ref(const float *q, int n_q, const uint16_t *k, const uint16_t *v, int n_pos, int hd, float scale,
                      float *out, AttnPartial *part);

// y (hd) = the normalised attention output of n_parts partials of one query head,
// the i-th at outs + i * out_stride and parts + i * part_stride.
void attend_combine(const float *outs, size_t out_stride, const AttnPartial *parts, size_t part_stride,
                    int n_parts, int hd, float *y);

} // namespace llmd
