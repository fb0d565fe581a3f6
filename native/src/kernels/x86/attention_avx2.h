// attention_avx2.h — the 256-bit variants' attention over a range of cached positions
// (ops/attention.h): a key block's 16 positions in two registers per dimension, keys
// and values of any KV type.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {

constexpr int kBlock = 64;           // positions scored before their values are summed

// How far ahead of its reads the kernel asks for a run's keys and values: as the AVX-512
// kernel's (7 % faster decode at 4k positions there), but cold or not (attend_range).
// SmolLM2's prefill with these kernels asking ahead on cold calls alone made pp512 7.4 %
// and pp2048 5.5 % slower than asking on every call (medians of 15 alternating rounds,
// Zen 5), where the AVX-512 kernel gained 8 to 10 %; on a Zen 3 dropping every request,
// cold ones included, cost 8 % of pp2048 (docs/performance.md).
constexpr size_t kAttnPrefetch = 4096;

// The dots' two halves (positions 0-7 and 8-15 of a key block) as C heads' scores
// (attention.h: AttnScale); positions past the range (the block's unwritten rest) score -inf.
template <int C> void store_scores(const __m256 (*dots)[2], AttnScale score, int valid, float *scores) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int h = 0; h < 2; ++h) {
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * h), lane));
        for (int g = 0; g < C; ++g) {
            __m256 scaled = _mm256_mul_ps(dots[g][h], _mm256_set1_ps(score.scale));
            if (score.softcap > 0.0f)
                scaled = _mm256_mul_ps(_mm256_set1_ps(score.softcap),
                                       tanh256(_mm256_mul_ps(scaled, _mm256_set1_ps(1.0f / score.softcap))));
            _mm256_store_ps(scores + g * kBlock + 8 * h, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), scaled, keep));
        }
    }
}

// Scores of C query heads (at q, hd apart) against a key block (kb: kKeyBlock
// positions dimension-major), each load one dimension of 8 of its keys, each query
// element broadcast once for both halves. Each head sums even and odd dimensions in
// two chains per half (an FMA's latency exceeds its issue interval) and adds them at
// the end, so its bits never depend on C: a head is scored the same whichever heads
// share its call. valid: the block's positions that exist. Not inlined: inside attend
// GCC kept two of the 16 registers for attend's own values and spilled an accumulator,
// whose load, FMA and store then chained every step of the loop.
template <int C>
__attribute__((noinline)) void score_block(const float *q, int hd, const uint8_t *kb8, AttnScale score, int valid,
                                           float *scores) {
    const uint16_t *kb = reinterpret_cast<const uint16_t *>(kb8);
    __m256 acc[C][2][2]; // head, half, parity
    for (int g = 0; g < C; ++g)
        for (int h = 0; h < 2; ++h) acc[g][h][0] = acc[g][h][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 2)
        for (int p = 0; p < 2; ++p) {
            const uint16_t *kd = kb + (d + p) * kKeyBlock;
            const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kd)));
            const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kd + 8)));
            for (int g = 0; g < C; ++g) {
                const __m256 qd = _mm256_broadcast_ss(q + g * hd + d + p);
                acc[g][0][p] = _mm256_fmadd_ps(qd, k0, acc[g][0][p]);
                acc[g][1][p] = _mm256_fmadd_ps(qd, k1, acc[g][1][p]);
            }
        }
    __m256 dots[C][2];
    for (int g = 0; g < C; ++g)
        for (int h = 0; h < 2; ++h) dots[g][h] = _mm256_add_ps(acc[g][h][0], acc[g][h][1]);
    store_scores<C>(dots, score, valid, scores);
}

// Scores of C query heads against a Q8_0 or Q4_0 key block (T), the queries quantized
// alike (q8: hd / 32 blocks a head): per 32 dimensions each step takes 4 dimensions of 8
// positions (attention.h) and sums u8 × s8 products exactly, in one chain per head and
// half. Q8_0: the keys' magnitudes against the query with the keys' signs (so that
// vpmaddubsw's pairs of products, at most 2 · 128 · 127, never saturate). Q4_0: the
// nibbles, 8 above their values (a load's low ones dimensions 4a.., its high ones
// 16 + 4a..), against the query, and 8 times the query block's sum taken back. Then
// times the positions' scales and the query block's scale into the dots. A head's bits
// never depend on C.
template <int C, uint32_t T>
void score_block_quant(const BlockQ8A *q8, int hd, const uint8_t *kb, AttnScale score, int valid, float *scores) {
    constexpr bool q8_0 = T == GGML_Q8_0;
    const int nb = hd / QK;
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256 dots[C][2];
    for (int g = 0; g < C; ++g) dots[g][0] = dots[g][1] = _mm256_setzero_ps();
    for (int c = 0; c < nb; ++c) {
        const uint8_t *gb = kb + c * kKeyBlock * kv_row_bytes(T, QK), *qs = gb + 2 * kKeyBlock;
        __m256i acc[C][2];
        for (int g = 0; g < C; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
        for (int s = 0; s < QK / 4; ++s) { // dimensions 4 s .. 4 s + 3
            const uint8_t *k4 = qs + (q8_0 ? s : s % 4) * 4 * kKeyBlock;
            __m256i k[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i *>(k4)),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(k4 + 32))};
            __m256i u[2];
            for (int h = 0; h < 2; ++h)
                u[h] = q8_0 ? _mm256_abs_epi8(k[h])
                            : _mm256_and_si256(s < 4 ? k[h] : _mm256_srli_epi16(k[h], 4), nibble);
            for (int g = 0; g < C; ++g) {
                int32_t q4;
                std::memcpy(&q4, q8[g * nb + c].qs + 4 * s, 4);
                const __m256i qb = _mm256_set1_epi32(q4);
                for (int h = 0; h < 2; ++h)
                    acc[g][h] = dot4_u8s8(acc[g][h], u[h], q8_0 ? _mm256_sign_epi8(qb, k[h]) : qb);
            }
        }
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(gb)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(gb + 16)));
        for (int g = 0; g < C; ++g) {
            const BlockQ8A &b = q8[g * nb + c];
            const __m256 dq = _mm256_set1_ps(b.d);
            const __m256i taken = _mm256_set1_epi32(q8_0 ? 0 : 8 * b.sum);
            dots[g][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[g][0], taken)), _mm256_mul_ps(d0, dq),
                                         dots[g][0]);
            dots[g][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[g][1], taken)), _mm256_mul_ps(d1, dq),
                                         dots[g][1]);
        }
    }
    store_scores<C>(dots, score, valid, scores);
}

// out (C heads, hd apart) += the weighted sum of `len` value rows (v, hd apart), for
// 8 × S dimensions from d0: the heads' sums stay in registers across the rows while
// each row's slice is converted once for all of them. Every output lane adds the rows
// in order, so its bits depend on neither C nor S.
template <int C, int S>
void sum_values(const float *weights, const uint16_t *v, int len, int hd, int d0, float *out) {
    __m256 acc[C][S];
    for (int g = 0; g < C; ++g)
        for (int s = 0; s < S; ++s) acc[g][s] = _mm256_loadu_ps(out + g * hd + d0 + 8 * s);
    for (int i = 0; i < len; ++i) {
        const uint16_t *row = v + static_cast<size_t>(i) * hd + d0;
        for (int s = 0; s < S; ++s) {
            const __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 8 * s)));
            for (int g = 0; g < C; ++g)
                acc[g][s] = _mm256_fmadd_ps(_mm256_broadcast_ss(weights + g * kBlock + i), vf, acc[g][s]);
        }
    }
    for (int g = 0; g < C; ++g)
        for (int s = 0; s < S; ++s) _mm256_storeu_ps(out + g * hd + d0 + 8 * s, acc[g][s]);
}

// out (C heads) += the weighted sum of `len` Q8_0 or Q4_0 value rows (vb, `row`
// bytes apart) for the 32 dimensions of block c: each row's block is converted once,
// weighted by the head's softmax weight times the block's scale, its lanes summed in
// row order.
template <int C>
void sum_values_quant(const float *weights, const uint8_t *vb, int len, int hd, uint32_t type, int c, float *out) {
    const size_t row = kv_row_bytes(type, hd), block = kv_row_bytes(type, QK);
    const __m128i nibble = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m256 acc[C][4];
    for (int g = 0; g < C; ++g)
        for (int s = 0; s < 4; ++s) acc[g][s] = _mm256_loadu_ps(out + g * hd + c * QK + 8 * s);
    for (int i = 0; i < len; ++i) {
        const uint8_t *b = vb + i * row + c * block;
        uint16_t dh;
        std::memcpy(&dh, b, 2);
        const float d = _cvtsh_ss(dh);
        __m128i lo, hi; // elements 0..15 and 16..31 as int8
        if (type == GGML_Q8_0) {
            lo = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
            hi = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 18));
        } else {
            const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
            lo = _mm_sub_epi8(_mm_and_si128(qs, nibble), eight);
            hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), nibble), eight);
        }
        const __m256 vf[4] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
                              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
                              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))};
        for (int g = 0; g < C; ++g) {
            const __m256 w = _mm256_set1_ps(weights[g * kBlock + i] * d);
            for (int s = 0; s < 4; ++s) acc[g][s] = _mm256_fmadd_ps(w, vf[s], acc[g][s]);
        }
    }
    for (int g = 0; g < C; ++g)
        for (int s = 0; s < 4; ++s) _mm256_storeu_ps(out + g * hd + c * QK + 8 * s, acc[g][s]);
}

// C heads against a key block of the keys' type.
template <int C>
void score_call(const float *q, const BlockQ8A *q8, int hd, const uint8_t *kb, uint32_t type, AttnScale score,
                int valid, float *scores) {
    if (type == GGML_F16) score_block<C>(q, hd, kb, score, valid, scores);
    else if (type == GGML_Q8_0) score_block_quant<C, GGML_Q8_0>(q8, hd, kb, score, valid, scores);
    else score_block_quant<C, GGML_Q4_0>(q8, hd, kb, score, valid, scores);
}

// Sixteen registers: the scores take heads at most three at a time (12 accumulators,
// two key rows), the values three at a time over 32 dimensions (12 accumulators). fn(g0,
// g1) for the heads [g0, g1) of each call, the calls as equal in size as they can be (7
// heads as 2, 2 and 3, not 3, 3 and 1: one head alone gives the FMAs a third of the
// chains; a verification of 8 drafts has 27 heads of SmolLM2 in calls of 6 and 7).
template <typename Fn> void by_threes(int n_q, const Fn &fn) {
    const int calls = (n_q + 2) / 3;
    for (int c = 0; c < calls; ++c) fn(n_q * c / calls, n_q * (c + 1) / calls);
}

void score_heads(const float *q, const BlockQ8A *q8, int n_q, int hd, const uint8_t *kb, uint32_t type, AttnScale score,
                 int valid, float *scores) {
    by_threes(n_q, [&](int g0, int g1) {
        const float *qg = q + g0 * hd;
        const BlockQ8A *q8g = q8 + g0 * (hd / QK);
        float *sg = scores + g0 * kBlock;
        switch (g1 - g0) {
        case 1: score_call<1>(qg, q8g, hd, kb, type, score, valid, sg); break;
        case 2: score_call<2>(qg, q8g, hd, kb, type, score, valid, sg); break;
        default: score_call<3>(qg, q8g, hd, kb, type, score, valid, sg); break;
        }
    });
}

template <int C>
void sum_values_heads(const float *weights, const uint8_t *vb, int len, int hd, uint32_t type, float *out) {
    if (type != GGML_F16) {
        for (int c = 0; c < hd / QK; ++c) sum_values_quant<C>(weights, vb, len, hd, type, c, out);
        return;
    }
    const uint16_t *v = reinterpret_cast<const uint16_t *>(vb);
    int d = 0;
    for (; d + 32 <= hd; d += 32) sum_values<C, 4>(weights, v, len, hd, d, out);
    for (; d < hd; d += 16) sum_values<C, 2>(weights, v, len, hd, d, out); // hd is a multiple of 16
}

void attend(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd, KVTypes types,
            AttnScale score, float *out, AttnPartial *part) {
    const size_t k_row = kv_row_bytes(types.k, hd), v_row = kv_row_bytes(types.v, hd);
    alignas(32) float scores[kMaxGroup][kBlock];
    float mx[kMaxGroup], sum[kMaxGroup];
    std::fill(mx, mx + n_q, -INFINITY);
    std::fill(sum, sum + n_q, 0.0f);
    std::fill(out, out + n_q * hd, 0.0f);
    for (int r = 0; r < n_runs; ++r) { // the runs' positions as one sequence
        const uint8_t *k = runs[r].k, *v = runs[r].v;
        for (int p0 = 0; p0 < runs[r].n_pos; p0 += kBlock) {
            const int len = std::min(kBlock, runs[r].n_pos - p0);
            if (p0 + kBlock >= runs[r].n_pos && r + 1 < n_runs) // the next run, while this block is attended
                prefetch_run(runs[r + 1].k, runs[r + 1].v, std::min(kBlock, runs[r + 1].n_pos), hd, types);
            for (int i0 = 0; i0 < len; i0 += kKeyBlock) {
                const uint8_t *kb = k + static_cast<size_t>(p0 + i0) * k_row;
                const uintptr_t ahead_k = reinterpret_cast<uintptr_t>(kb) + kAttnPrefetch;
                const uintptr_t ahead_v =
                    reinterpret_cast<uintptr_t>(v + static_cast<size_t>(p0 + i0) * v_row) + kAttnPrefetch;
                for (size_t at = 0; at < kKeyBlock * k_row; at += 64)
                    _mm_prefetch(reinterpret_cast<const char *>(ahead_k + at), _MM_HINT_T0);
                for (size_t at = 0; at < kKeyBlock * v_row; at += 64)
                    _mm_prefetch(reinterpret_cast<const char *>(ahead_v + at), _MM_HINT_T0);
                score_heads(q, q8, n_q, hd, kb, types.k, score, len - i0, &scores[0][i0]);
            }
            for (int i = (len + 15) / 16 * 16; i < kBlock; ++i)
                for (int g = 0; g < n_q; ++g) scores[g][i] = -INFINITY;
            // Softmax weights, rescaling what was summed so far when the max grows.
            for (int g = 0; g < n_q; ++g) {
                __m256 bm = _mm256_set1_ps(-INFINITY);
                for (int i = 0; i < kBlock; i += 8) bm = _mm256_max_ps(bm, _mm256_load_ps(&scores[g][i]));
                const float new_max = std::max(mx[g], hmax256(bm));
                if (new_max > mx[g]) {
                    const float shrink = std::exp(mx[g] - new_max); // 0 on the first block
                    sum[g] *= shrink;
                    for (int d = 0; d < hd; ++d) out[g * hd + d] *= shrink;
                    mx[g] = new_max;
                }
                __m256 s = _mm256_setzero_ps();
                for (int i = 0; i < kBlock; i += 8) {
                    const __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(&scores[g][i]), _mm256_set1_ps(new_max)));
                    _mm256_store_ps(&scores[g][i], e);
                    s = _mm256_add_ps(s, e);
                }
                sum[g] += hsum256(s);
            }
            const uint8_t *vb = v + static_cast<size_t>(p0) * v_row;
            by_threes(n_q, [&](int g0, int g1) {
                float *og = out + g0 * hd;
                switch (g1 - g0) {
                case 1: sum_values_heads<1>(scores[g0], vb, len, hd, types.v, og); break;
                case 2: sum_values_heads<2>(scores[g0], vb, len, hd, types.v, og); break;
                default: sum_values_heads<3>(scores[g0], vb, len, hd, types.v, og); break;
                }
            });
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}


void attend_range_avx2(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                       KVTypes types, AttnScale score, float *out, AttnPartial *part, bool cold) {
    if (hd % 16 != 0 || n_q > kMaxGroup)
        return attend_range_ref(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    attend(q, q8, n_q, runs, n_runs, hd, types, score, out, part);
}

} // namespace
} // namespace llmd
