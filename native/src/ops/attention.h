// attention.h — causal attention for one token: the query heads that share a KV
// head, over a range of its session's cached positions.
//
// A range yields a partial result (the streaming, "online" softmax): the running
// max of its scores, the sum of exp(score - max), and the unnormalised output
// sum of exp(score - max) * v. Partials of adjacent ranges fold into one result, so
// one long context can be split across threads. Each kernel has a scalar reference
// (`*_ref`); tests compare them through llmd_kernel_attention.
#pragma once

#include "quants/quants.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace llmd {

constexpr int kMaxGroup = 16; // query heads per KV head of the fast kernel; wider groups use the reference

// ---- how the cache stores keys and values -----------------------------------
//
// Keys and values of one KV head are stored by type (KVTypes: llama.cpp's -ctk and
// -ctv), each a GGUF type: F16, Q8_0 (per 32 elements an f16 scale d and 32 int8
// q, x = d q) or Q4_0 (per 32 an f16 d and 32 4-bit q, x = d (q - 8)). A type's
// "row" is one position of one head as the GGUF row of hd elements (hd / 32 blocks
// of 34 or 18 bytes for the quantized ones, hd halves for F16): kv_row_bytes(t, hd).
//
// Values are stored as rows, position after position: the kernel weights a whole row
// by the position's softmax weight times each block's scale, 32 dimensions at a time.
//
// Keys are stored in key blocks of kKeyBlock positions (kKeyBlock rows' bytes), laid
// out so that one load holds 16 positions (one dimension of them, or 4 for the
// quantized types): 16 scores build up in one register, without any horizontal sum, as
// the kernel walks the dimensions.
//   F16:  element d of position i at halves [d * 16 + i] (key_at).
//   Q8_0, Q4_0: per 32 dimensions c (hd / 32 groups, 16 blocks' bytes each) the 16
//         positions' scales as f16 [16], then their blocks' quants (32 or 16 bytes) in
//         groups of 4 bytes a position: byte j of position i's block at [j / 4][i][j % 4].
//         A Q8_0 byte j is dimension c·32 + j; a Q4_0 byte j holds dimension c·32 + j in
//         its low nibble and c·32 + j + 16 in its high one (GGUF's element order within
//         a block). A 4-byte lane is what one step of an integer dot-product
//         instruction (x86 vpdpbusd, arm sdot) sums for one position.
// Quantized keys meet the query quantized alike, per 32 dimensions into Q8A blocks
// (quants.h: quantize_q8a, the activations' format), as llama.cpp quantizes it for
// them: a group's 16 scores are exact integer sums, converted to floats in registers
// and multiplied by the 16 key scales times the query block's scale. With the query in
// floats, each key was converted to floats first: the avx512 kernel over Q8_0 keys
// and values (8 heads, 256 positions, Zen 5) ran at 62 G multiply-adds/s, now 109
// (with sum_quant's rows scaled once), and SmolLM2 prefilled 8,192 tokens 30 % faster;
// the query's quantization costs no perplexity that shows (docs/sessions.md).
// Either type reads 53 % (Q8_0) or 28 % (Q4_0) of F16's bytes, which a decode step at
// long context, bound by reading the cache, gains from.
// A key block's bytes equal 16 rows', so positions map to memory by rows alone.
//
// Rotation. A quantized key or value is stored rotated: each block of n dimensions
// multiplied by the n × n Walsh-Hadamard matrix H (entries ±1, H H = n I), which
// spreads a few large dimensions over the block, so that one scale per 32 fits them
// all (as llama.cpp does since its PR 21038: on SmolLM2, Q4_0 keys cost a quarter of
// the perplexity unrotated). Attention is unchanged: the query is rotated alike and
// divided by n, since (H q / n) · (H k) = q · k, and the output, a sum of rotated
// values, is rotated back, H (Σ w H v) / n = Σ w v. Keys rotate in blocks of the
// largest power of two dividing hd, values in blocks of 64 (32 where hd is not a
// multiple of 64), as llama.cpp found best; f16 keys and values are not rotated.
struct KVTypes {
    uint32_t k = GGML_F16, v = GGML_F16; // GGUF type numbers (quants.h)
};

// Bytes of one position of one head of type t (F16, Q8_0 or Q4_0; hd a multiple of 32
// for the quantized ones).
inline size_t kv_row_bytes(uint32_t t, int hd) {
    const size_t n = static_cast<size_t>(hd);
    return t == GGML_Q8_0 ? n / 32 * 34 : t == GGML_Q4_0 ? n / 32 * 18 : n * 2;
}

// The KV types a cache may use, by name: "f16", "q8_0", "q4_0" (kKVTypeNames lists
// them for messages); false for another name.
bool kv_type_from_name(const char *name, uint32_t *type);
const char *kv_type_name(uint32_t type);
constexpr const char *kKVTypeNames = "f16, q8_0, q4_0";
// Whether a head of hd dimensions can be stored as type t; else *why says why.
bool kv_type_fits(uint32_t t, int hd, const char **why);

// The rotation's block for keys (keys = true) or values of type t: 0 for none (f16).
int kv_rotation(uint32_t t, int hd, bool keys);
// x (hd) := each block of n of it times H (unnormalised: the caller divides by n where
// it must), in a fixed order: a row's bits depend on its own numbers alone.
void kv_rotate(float *x, int hd, int n);

// Keys are stored in blocks of kKeyBlock positions (above). A range of positions
// starts at a block boundary.
constexpr int kKeyBlock = 16;
inline size_t key_at(int p, int d, int hd) { // an F16 key's element d of position p in its run
    return static_cast<size_t>(p - p % kKeyBlock) * hd + static_cast<size_t>(d) * kKeyBlock + p % kKeyBlock;
}
// The key block of position p of a run starting at k (keys of type t).
inline uint8_t *key_block(uint8_t *k, uint32_t t, int p, int hd) {
    return k + static_cast<size_t>(p - p % kKeyBlock) * kv_row_bytes(t, hd);
}
inline const uint8_t *key_block(const uint8_t *k, uint32_t t, int p, int hd) {
    return k + static_cast<size_t>(p - p % kKeyBlock) * kv_row_bytes(t, hd);
}
// A key as its row (above) into position i of key block kb, and back.
void key_store(uint32_t t, const uint8_t *row, uint8_t *kb, int i, int hd);
void key_load(uint32_t t, const uint8_t *kb, int i, int hd, uint8_t *row);

// How a query-key dot product becomes an attention score: times scale and, where
// softcap is positive, soft-capped to softcap · tanh(score / softcap), which keeps every
// score inside (-softcap, softcap) (Gemma 2's attention logit soft-capping).
struct AttnScale {
    float scale;
    float softcap = 0.0f; // 0: none
};

// One score as the reference computes it (in double).
inline double attn_score(double dot, AttnScale s) {
    const double x = dot * s.scale;
    return s.softcap > 0.0f ? s.softcap * std::tanh(x / s.softcap) : x;
}

struct AttnPartial {
    float max; // largest score seen (-inf for an empty range)
    float sum; // sum of exp(score - max)
};

// A range's positions as one or more runs, each contiguous in memory: keys in key
// blocks from the run's start, values as rows. A range of a paged cache spans pool
// blocks (kvpool.h), a ring's range may wrap: the kernel reads their runs in order
// as if they were one, so where memory breaks never changes a bit while each run but
// the last is a whole number of the kernel's 64-position blocks.
struct AttnRun {
    const uint8_t *k;
    const uint8_t *v;
    int n_pos;
};

// Asks the memory system for the first n_pos positions of a run (keys and values)
// ahead of their use: a paged cache's next block may lie elsewhere in memory (where
// its session's previous block had no free slot behind it, kvpool.h), where the
// hardware's prefetchers, which follow a stream, have not gone yet.
inline void prefetch_run(const uint8_t *k, const uint8_t *v, int n_pos, int hd, KVTypes types) {
    const size_t k_bytes = static_cast<size_t>(n_pos) * kv_row_bytes(types.k, hd);
    const size_t v_bytes = static_cast<size_t>(n_pos) * kv_row_bytes(types.v, hd);
    for (size_t at = 0; at < k_bytes; at += 64) __builtin_prefetch(k + at);
    for (size_t at = 0; at < v_bytes; at += 64) __builtin_prefetch(v + at);
}

// q: (n_q, hd) queries over the positions of the n_runs `runs`, stored as `types`;
// q8: the same quantized (n_q × hd / 32 blocks of quantize_q8a), read for quantized
// keys alone. Writes out (n_q, hd) = sum over positions of exp(score(q·k) - max) * v, and
// part (n_q). The fast kernel may read the unwritten rest of a run's last key block.
// cold: whether the runs' memory is likely out of the caches (no call has just read
// it). The avx512 kernel asks for it ahead of its reads only then (and the arm ones,
// which ask only for the next run), which a decode step streaming a long context from
// memory gains from: over positions another call has just read, the requests were a
// tenth of the avx512 kernel's time (8 heads over 256 positions on Zen 5) for nothing.
// The 256-bit kernels ask ahead either way (attention_avx2.h: kAttnPrefetch).
void attend_range(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd, KVTypes types,
                  AttnScale score, float *out, AttnPartial *part, bool cold);
// The reference: every key and value decoded to floats by its type's to_float
// (quants.h), the dot products (with q8's values for quantized keys) and sums in double;
// it reads as it goes, cold or not.
void attend_range_ref(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                      KVTypes types, AttnScale score, float *out, AttnPartial *part, bool cold);

// ---- a whole context ------------------------------------------------------
//
// The arithmetic depends on positions alone, so that one token's output is the same
// bits whatever else shares its batch, however its prefill is chunked and however
// many threads run: a context is cut into ranges of kAttnRange positions counted
// from position 0, each range is attended on its own (attend_range), and their
// partials are folded into the result in order, range 0 first (attend_fold), then
// normalised (attend_finish). Which thread attends which range is free. 256
// positions: a decode step over a few hundred positions still splits across two
// threads, and an 8k-token context folds 32 partials per head. Ranges of 128 folded
// twice as often: a tenth of SmolLM2's prefill of 4,096 tokens went to folding, and
// 256 prefilled it 6 % faster and decoded at 4,096 positions 10 % faster
// (docs/performance.md, "The cost of determinism").
constexpr int kAttnRange = 256; // a multiple of kKeyBlock and of kKVBlock, at most kMaxBatch
inline int attn_range_count(int n_pos) { return (n_pos + kAttnRange - 1) / kAttnRange; }

// How many tasks share the ranges of one (run of tokens, KV head) pair, for `pairs` of
// them of at most `ranges` ranges each on `threads` threads: 1 (a task attends them all)
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
// Attention sinks (gpt-oss): each query head's logit sinks[g] joins its softmax's
// denominator and adds nothing to its output, as if a position of that score with a
// value of zeros were attended. Folded into the running result after the last range
// and before attend_finish, as a partial of max sinks[g], sum 1 and output zero: the
// same arithmetic as attend_fold's, in the same place whatever the batch, the ranges
// or the kernel variant.
void attend_sink(float *y, AttnPartial *acc, const float *sinks, int n_q, int hd);

} // namespace llmd
