// attention_avx512.h — the avx512 variant's attention over a range of cached
// positions (ops/attention.h): 16 keys' scores a register, keys and values of any KV type.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx512.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {


constexpr int kBlock = 64;        // positions scored before their values are summed

// How far ahead of its reads the kernel asks for a cold run's keys and values
// (attend_range: cold). A decode step at long context streams them from memory,
// latency-bound with the hardware prefetchers alone: SmolLM2 decoded at 4,096
// positions 7 % faster asking 4 KB ahead (2 KB: 6 %; 8 KB: 1 %). Past a run's end
// this asks for memory the kernel may not read (another head's, or none: a prefetch
// never faults); attend_span asks for the next run where memory breaks.
constexpr size_t kAttnPrefetch = 4096;

// 16 dot products as scores (attention.h: AttnScale).
inline __m512 to_scores(__m512 dots, AttnScale s) {
    const __m512 x = _mm512_mul_ps(dots, _mm512_set1_ps(s.scale));
    if (s.softcap <= 0.0f) return x;
    return _mm512_mul_ps(_mm512_set1_ps(s.softcap), tanh512(_mm512_mul_ps(x, _mm512_set1_ps(1.0f / s.softcap))));
}

// Scores of the n_q heads against key block kb (attention.h), 16 positions a
// register each: dots[g] = q_g · k. Every query of the group accumulates from each
// load, in two chains each (an FMA's latency exceeds its issue interval); a head's
// bits never depend on which heads share its call.
template <int G> void score_f16(const float *q, int n_q_, int hd, const uint8_t *kb, __m512 *dots) {
    const int n_q = G > 0 ? G : n_q_;
    __m512 acc[kMaxGroup][2];
    for (int g = 0; g < n_q; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 2)
        for (int h = 0; h < 2; ++h) {
            const __m512 kd = _mm512_cvtph_ps(
                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(kb + 2 * (d + h) * kKeyBlock)));
            for (int g = 0; g < n_q; ++g) acc[g][h] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + d + h]), kd, acc[g][h]);
        }
    for (int g = 0; g < n_q; ++g) dots[g] = _mm512_add_ps(acc[g][0], acc[g][1]);
}

// Q8_0 or Q4_0 keys (T) against the queries quantized alike (q8: hd / 32 blocks a head),
// per 32 dimensions: each step takes 4 dimensions of the 16 positions (attention.h) as
// vpdpbusd's unsigned operand, Q8_0's bytes offset by 128, Q4_0's nibbles (8 above their
// values; a load's low ones dimensions 4a.., its high ones 16 + 4a..), sums them exactly
// in two chains per head and takes the offset times the query block's sum back; then
// times the 16 key scales and the query block's scale into the scores.
template <int G, uint32_t T>
void score_quant(const BlockQ8A *q8, int n_q_, int hd, const uint8_t *kb, __m512 *dots) {
    constexpr bool q8_0 = T == GGML_Q8_0;
    constexpr int32_t offset = q8_0 ? 128 : 8;
    const int n_q = G > 0 ? G : n_q_, nb = hd / QK;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), nibble = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < n_q; ++g) dots[g] = _mm512_setzero_ps();
    for (int c = 0; c < nb; ++c) {
        const uint8_t *gb = kb + c * kKeyBlock * kv_row_bytes(T, QK), *qs = gb + 2 * kKeyBlock;
        __m512i acc[kMaxGroup][2];
        for (int g = 0; g < n_q; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_si512();
        for (int a = 0; a < QK / 4; a += 2)
            for (int h = 0; h < 2; ++h) { // dimensions 4 (a + h) .. 4 (a + h) + 3
                const int s = a + h;
                __m512i k;
                if constexpr (q8_0) {
                    k = _mm512_xor_si512(_mm512_loadu_si512(qs + s * 4 * kKeyBlock), flip);
                } else {
                    const __m512i b = _mm512_loadu_si512(qs + s % 4 * 4 * kKeyBlock);
                    k = _mm512_and_si512(s < 4 ? b : _mm512_srli_epi16(b, 4), nibble);
                }
                for (int g = 0; g < n_q; ++g) {
                    int32_t q4;
                    std::memcpy(&q4, q8[g * nb + c].qs + 4 * s, 4);
                    acc[g][h] = _mm512_dpbusd_epi32(acc[g][h], k, _mm512_set1_epi32(q4));
                }
            }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(gb)));
        for (int g = 0; g < n_q; ++g) {
            const BlockQ8A &b = q8[g * nb + c];
            const __m512i sum =
                _mm512_sub_epi32(_mm512_add_epi32(acc[g][0], acc[g][1]), _mm512_set1_epi32(offset * b.sum));
            dots[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(b.d)), dots[g]);
        }
    }
}

// out (n_q heads, hd apart) += the weighted sum of `len` F16 value rows from vb, 16 × S
// dimensions from d0: the group's outputs stay in registers while each value row's
// slices are converted once for all of them, and the S slices give the FMAs G × S
// independent chains: one slice at a time, a few heads' FMAs waited on each other
// (3 heads over 256 positions ran at 54 G multiply-adds/s, 4 slices 65; 4 heads 63
// and 74; Zen 5, one thread). Every output lane adds the rows in order, so its bits
// depend on neither G nor S.
template <int G, int S>
void sum_f16_slices(const float (*weights)[kBlock], int n_q_, const uint16_t *v, int len, int hd, int d0, float *out) {
    const int n_q = G > 0 ? G : n_q_;
    __m512 acc[kMaxGroup][S];
    for (int g = 0; g < n_q; ++g)
        for (int s = 0; s < S; ++s) acc[g][s] = _mm512_loadu_ps(out + g * hd + d0 + 16 * s);
    for (int i = 0; i < len; ++i) {
        const uint16_t *row = v + static_cast<size_t>(i) * hd + d0;
        for (int s = 0; s < S; ++s) {
            const __m512 vf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + 16 * s)));
            for (int g = 0; g < n_q; ++g) acc[g][s] = _mm512_fmadd_ps(_mm512_set1_ps(weights[g][i]), vf, acc[g][s]);
        }
    }
    for (int g = 0; g < n_q; ++g)
        for (int s = 0; s < S; ++s) _mm512_storeu_ps(out + g * hd + d0 + 16 * s, acc[g][s]);
}

// Four slices at a time for up to 4 heads, two for more (6 heads over 256 positions:
// 83-87 G multiply-adds/s with 4 slices, 24 accumulators, against 89-94 with 2), one
// for a group of unfixed size (up to kMaxGroup heads).
template <int G>
void sum_f16(const float (*weights)[kBlock], int n_q, const uint8_t *vb, int len, int hd, float *out) {
    constexpr int S = G == 0 ? 1 : G <= 4 ? 4 : 2;
    const uint16_t *v = reinterpret_cast<const uint16_t *>(vb);
    int d = 0;
    for (; d + 16 * S <= hd; d += 16 * S) sum_f16_slices<G, S>(weights, n_q, v, len, hd, d, out);
    for (; d < hd; d += 16) sum_f16_slices<G, 1>(weights, n_q, v, len, hd, d, out); // hd is a multiple of 16
}

// Q8_0 or Q4_0 value rows, a block of 32 dimensions at a time: each row's block is
// converted once and times its scale, then weighted by each head's softmax weight
// (an FMA whose broadcast operand comes from memory, as sum_f16's).
template <int G>
void sum_quant(const float (*weights)[kBlock], int n_q_, const uint8_t *vb, int len, int hd, uint32_t type,
               float *out) {
    const int n_q = G > 0 ? G : n_q_;
    const size_t row = kv_row_bytes(type, hd), block = kv_row_bytes(type, QK);
    const __m128i nibble = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int c = 0; c < hd / QK; ++c) {
        __m512 acc[kMaxGroup][2];
        for (int g = 0; g < n_q; ++g)
            for (int h = 0; h < 2; ++h) acc[g][h] = _mm512_loadu_ps(out + g * hd + c * QK + 16 * h);
        for (int i = 0; i < len; ++i) {
            const uint8_t *b = vb + i * row + c * block;
            uint16_t dh;
            std::memcpy(&dh, b, 2);
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
            __m128i lo, hi; // elements 0..15 and 16..31 as int8
            if (type == GGML_Q8_0) {
                lo = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
                hi = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 18));
            } else {
                const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
                lo = _mm_sub_epi8(_mm_and_si128(qs, nibble), eight);
                hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), nibble), eight);
            }
            const __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
            const __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
            for (int g = 0; g < n_q; ++g) {
                const __m512 w = _mm512_set1_ps(weights[g][i]);
                acc[g][0] = _mm512_fmadd_ps(w, v0, acc[g][0]);
                acc[g][1] = _mm512_fmadd_ps(w, v1, acc[g][1]);
            }
        }
        for (int g = 0; g < n_q; ++g)
            for (int h = 0; h < 2; ++h) _mm512_storeu_ps(out + g * hd + c * QK + 16 * h, acc[g][h]);
    }
}

// G query heads, or n_q of them when G is 0: a fixed G keeps the group's value
// sums in registers.
template <int G>
void attend(const float *q, const BlockQ8A *q8, int n_q_, const AttnRun *runs, int n_runs, int hd, KVTypes types,
            AttnScale score, float *out, AttnPartial *part, bool cold) {
    const int n_q = G > 0 ? G : n_q_;
    const size_t k_row = kv_row_bytes(types.k, hd), v_row = kv_row_bytes(types.v, hd);
    alignas(64) float scores[kMaxGroup][kBlock];
    float mx[kMaxGroup], sum[kMaxGroup];
    std::fill(mx, mx + n_q, -INFINITY);
    std::fill(sum, sum + n_q, 0.0f);
    std::fill(out, out + n_q * hd, 0.0f);
    for (int r = 0; r < n_runs; ++r) { // the runs' positions as one sequence
        const uint8_t *k = runs[r].k, *v = runs[r].v;
        for (int p0 = 0; p0 < runs[r].n_pos; p0 += kBlock) {
            const int len = std::min(kBlock, runs[r].n_pos - p0);
            if (cold && p0 + kBlock >= runs[r].n_pos && r + 1 < n_runs) // the next run, while this block is attended
                prefetch_run(runs[r + 1].k, runs[r + 1].v, std::min(kBlock, runs[r + 1].n_pos), hd, types);
            // Scores, a key block at a time: each load is one dimension of 16 keys, and
            // every query of the group accumulates 16 scores from it (two chains each, as
            // an FMA's latency exceeds its issue interval).
            for (int i0 = 0; i0 < len; i0 += kKeyBlock) {
                const uint8_t *kb = k + static_cast<size_t>(p0 + i0) * k_row;
                if (cold) {
                    const uintptr_t ahead_k = reinterpret_cast<uintptr_t>(kb) + kAttnPrefetch;
                    const uintptr_t ahead_v =
                        reinterpret_cast<uintptr_t>(v + static_cast<size_t>(p0 + i0) * v_row) + kAttnPrefetch;
                    for (size_t at = 0; at < kKeyBlock * k_row; at += 64)
                        _mm_prefetch(reinterpret_cast<const char *>(ahead_k + at), _MM_HINT_T0);
                    for (size_t at = 0; at < kKeyBlock * v_row; at += 64)
                        _mm_prefetch(reinterpret_cast<const char *>(ahead_v + at), _MM_HINT_T0);
                }
                __m512 dots[kMaxGroup];
                if (types.k == GGML_Q8_0) score_quant<G, GGML_Q8_0>(q8, n_q, hd, kb, dots);
                else if (types.k == GGML_Q4_0) score_quant<G, GGML_Q4_0>(q8, n_q, hd, kb, dots);
                else score_f16<G>(q, n_q, hd, kb, dots);
                // Positions past the range (the block's unwritten rest) score -inf.
                const __mmask16 valid = static_cast<__mmask16>((1u << std::min(kKeyBlock, len - i0)) - 1);
                for (int g = 0; g < n_q; ++g) {
                    _mm512_store_ps(&scores[g][i0],
                                    _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), to_scores(dots[g], score)));
                }
            }
            for (int i = (len + 15) / 16 * 16; i < kBlock; ++i)
                for (int g = 0; g < n_q; ++g) scores[g][i] = -INFINITY;
            // Softmax weights, rescaling what was summed so far when the max grows.
            for (int g = 0; g < n_q; ++g) {
                __m512 bm = _mm512_set1_ps(-INFINITY);
                for (int i = 0; i < kBlock; i += 16) bm = _mm512_max_ps(bm, _mm512_load_ps(&scores[g][i]));
                const float new_max = std::max(mx[g], _mm512_reduce_max_ps(bm));
                if (new_max > mx[g]) {
                    const float shrink = std::exp(mx[g] - new_max); // 0 on the first block
                    sum[g] *= shrink;
                    for (int d = 0; d < hd; ++d) out[g * hd + d] *= shrink;
                    mx[g] = new_max;
                }
                __m512 s = _mm512_setzero_ps();
                for (int i = 0; i < kBlock; i += 16) {
                    const __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(&scores[g][i]), _mm512_set1_ps(new_max)));
                    _mm512_store_ps(&scores[g][i], e);
                    s = _mm512_add_ps(s, e);
                }
                sum[g] += _mm512_reduce_add_ps(s);
            }
            const uint8_t *vb = v + static_cast<size_t>(p0) * v_row;
            if (types.v == GGML_F16) sum_f16<G>(scores, n_q, vb, len, hd, out);
            else sum_quant<G>(scores, n_q, vb, len, hd, types.v, out);
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}

void attend_range_avx512(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                         KVTypes types, AttnScale score, float *out, AttnPartial *part, bool cold) {
    if (hd % 16 != 0 || n_q > kMaxGroup) {
        attend_range_ref(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
        return;
    }
    switch (n_q) { // the group sizes of common models
    case 1: return attend<1>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 2: return attend<2>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 3: return attend<3>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 4: return attend<4>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 6: return attend<6>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 7: return attend<7>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    case 8: return attend<8>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    default: return attend<0>(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    }
}

} // namespace
} // namespace llmd
