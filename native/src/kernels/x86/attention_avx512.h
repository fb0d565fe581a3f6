// attention_avx512.h — the avx512 variant's attention over a range of cached
// positions (ops/attention.h): 16 keys' scores a register.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx512.h"

#include <algorithm>
#include <cmath>
#include <immintrin.h>

namespace llmd {
namespace {


constexpr int kBlock = 64;        // positions scored before their values are summed

// How far ahead of its reads the kernel asks for a run's keys and values. A decode
// step at long context streams them from memory, latency-bound with the hardware
// prefetchers alone: SmolLM2 decoded at 4,096 positions 7 % faster asking 4 KB ahead
// (2 KB: 6 %; 8 KB: 1 %). Past a run's end this asks for memory the kernel may
// not read (another head's, or none: a prefetch never faults); attend_span asks for
// the next run where memory breaks.
constexpr size_t kAttnPrefetch = 4096;

// G query heads, or n_q of them when G is 0: a fixed G keeps the group's value
// sums in registers.
template <int G>
void attend(const float *q, int n_q_, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
            AttnPartial *part) {
    const int n_q = G > 0 ? G : n_q_;
    alignas(64) float scores[kMaxGroup][kBlock];
    float mx[kMaxGroup], sum[kMaxGroup];
    std::fill(mx, mx + n_q, -INFINITY);
    std::fill(sum, sum + n_q, 0.0f);
    std::fill(out, out + n_q * hd, 0.0f);
    for (int r = 0; r < n_runs; ++r) { // the runs' positions as one sequence
        const uint16_t *k = runs[r].k, *v = runs[r].v;
        for (int p0 = 0; p0 < runs[r].n_pos; p0 += kBlock) {
            const int len = std::min(kBlock, runs[r].n_pos - p0);
            if (p0 + kBlock >= runs[r].n_pos && r + 1 < n_runs) // the next run, while this block is attended
                prefetch_run(runs[r + 1].k, runs[r + 1].v, std::min(kBlock, runs[r + 1].n_pos), hd);
            // Scores, a key block at a time: each load is one dimension of 16 keys, and
            // every query of the group accumulates 16 scores from it (two chains each, as
            // an FMA's latency exceeds its issue interval).
            for (int i0 = 0; i0 < len; i0 += kKeyBlock) {
                const uint16_t *kb = k + static_cast<size_t>(p0 + i0) * hd;
                const uintptr_t ahead_k = reinterpret_cast<uintptr_t>(kb) + kAttnPrefetch;
                const uintptr_t ahead_v = reinterpret_cast<uintptr_t>(v + static_cast<size_t>(p0 + i0) * hd) + kAttnPrefetch;
                for (size_t at = 0; at < kKeyBlock * hd * sizeof(uint16_t); at += 64) {
                    _mm_prefetch(reinterpret_cast<const char *>(ahead_k + at), _MM_HINT_T0);
                    _mm_prefetch(reinterpret_cast<const char *>(ahead_v + at), _MM_HINT_T0);
                }
                __m512 acc[kMaxGroup][2];
                for (int g = 0; g < n_q; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
                for (int d = 0; d < hd; d += 2)
                    for (int h = 0; h < 2; ++h) {
                        const __m512 kd = _mm512_cvtph_ps(
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(kb + (d + h) * kKeyBlock)));
                        for (int g = 0; g < n_q; ++g)
                            acc[g][h] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + d + h]), kd, acc[g][h]);
                    }
                // Positions past the range (the block's unwritten rest) score -inf.
                const __mmask16 valid = static_cast<__mmask16>((1u << std::min(kKeyBlock, len - i0)) - 1);
                for (int g = 0; g < n_q; ++g) {
                    const __m512 dots = _mm512_mul_ps(_mm512_add_ps(acc[g][0], acc[g][1]), _mm512_set1_ps(scale));
                    _mm512_store_ps(&scores[g][i0], _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), dots));
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
            // Values, 16 dimensions at a time: the group's outputs stay in registers while
            // each value row's slice is converted once for all of them.
            for (int d = 0; d < hd; d += 16) {
                __m512 acc[kMaxGroup];
                for (int g = 0; g < n_q; ++g) acc[g] = _mm512_loadu_ps(out + g * hd + d);
                for (int i = 0; i < len; ++i) {
                    const __m512 vf = _mm512_cvtph_ps(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(v + static_cast<size_t>(p0 + i) * hd + d)));
                    for (int g = 0; g < n_q; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g][i]), vf, acc[g]);
                }
                for (int g = 0; g < n_q; ++g) _mm512_storeu_ps(out + g * hd + d, acc[g]);
            }
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}

void attend_range_avx512(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                  AttnPartial *part) {
    if (hd % 16 != 0 || n_q > kMaxGroup) {
        attend_range_ref(q, n_q, runs, n_runs, hd, scale, out, part);
        return;
    }
    switch (n_q) { // the group sizes of common models
    case 1: return attend<1>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 2: return attend<2>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 3: return attend<3>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 4: return attend<4>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 6: return attend<6>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 7: return attend<7>(q, n_q, runs, n_runs, hd, scale, out, part);
    case 8: return attend<8>(q, n_q, runs, n_runs, hd, scale, out, part);
    default: return attend<0>(q, n_q, runs, n_runs, hd, scale, out, part);
    }
}

} // namespace
} // namespace llmd
