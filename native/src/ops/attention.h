// attention.h — causal attention for one token: the query heads that share a KV
// head, over a range of its session's cached positions.
//
// A range yields a partial result (the streaming, "online" softmax): the running
// max of its scores, the sum of exp(score - max), and the unnormalised output
// sum of exp(score - max) * v. Partials of adjacent ranges fold into one result, so
// one long context can be split across threads. Each kernel has a scalar reference
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

// A range's positions as one or more runs, each contiguous in memory: keys in blocks
// from the run's start (key_at), values as rows of hd. A range of a paged cache
// spans pool blocks (kvpool.h), a ring's range may wrap: the kernel reads their
// runs in order as if they were one, so where memory breaks never changes a bit
// while each run but the last is a whole number of the kernel's 64-position blocks.
struct AttnRun {
    const uint16_t *k;
    const uint16_t *v;
    int n_pos;
};

// Asks the memory system for the first n_pos positions of a run (keys and values)
// ahead of their use: a paged cache's next block may lie elsewhere in memory (where
// its session's previous block had no free slot behind it, kvpool.h), where the
// hardware's prefetchers, which follow a stream, have not gone yet.
inline void prefetch_run(const uint16_t *k, const uint16_t *v, int n_pos, int hd) {
    const size_t bytes = static_cast<size_t>(n_pos) * hd * sizeof(uint16_t);
    for (size_t at = 0; at < bytes; at += 64) {
        __builtin_prefetch(reinterpret_cast<const char *>(k) + at);
        __builtin_prefetch(reinterpret_cast<const char *>(v) + at);
    }
}

// q: (n_q, hd) queries over the positions of the n_runs `runs`. Writes out (n_q, hd) = sum over positions of exp(scale * q·k - max) * v, and
// part (n_q). The fast kernel may read the unwritten rest of a run's last key block.
void attend_range(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                  AttnPartial *part);
void attend_range_ref(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                      AttnPartial *part);

// ---- a whole context ------------------------------------------------------
//
// The arithmetic depends on positions alone, so that one token's output is the same
// bits whatever else shares its batch, however its prefill is chunked and however
// many threads run: a context is cut into ranges of kAttnRange positions counted
// from position 0, each range is attended on its own (attend_range), and their
// partials are folded into the result in order, range 0 first (attend_fold), then
// normalised (attend_finish). Which thread attends which range is free. 128
// positions: a decode step over a few hundred positions still splits across two
// threads, and a 2k-token context folds only 16 partials per head.
constexpr int kAttnRange = 128; // a multiple of kKeyBlock
inline int attn_range_count(int n_pos) { return (n_pos + kAttnRange - 1) / kAttnRange; }

// How many tasks share the ranges of one (token, KV head), for `pairs` of them of at
// most `ranges` ranges each on `threads` threads: 1 (a task attends a whole context)
// when the pairs alone give every thread 4 tasks, else enough that they do, as a
// multiple of the thread count. Only the schedule depends on it, never a result.
int attn_task_spans(int pairs, int ranges, int threads);

// A running result of n_q query heads, y (n_q, hd) and acc (n_q): attend_start
// empties it, attend_fold adds the next range's partial (out, part), rescaling what
// is there to the larger max, and attend_finish divides by the sum.
void attend_start(float *y, AttnPartial *acc, int n_q, int hd);
void attend_fold(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd);
void attend_fold_ref(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd);
void attend_finish(float *y, const AttnPartial *acc, int n_q, int hd);

} // namespace llmd
