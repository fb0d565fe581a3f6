// ops_avx2.h — the 256-bit variants' vector operations (kernels.h): activation
// quantization, GLU, the sum of squares of rmsnorm and the Gated
// DeltaNet and Mamba-2 scans, 8 lanes at a time.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx2.h"

#include <algorithm>
#include <cmath>
#include <immintrin.h>

namespace llmd {
namespace {

// quantize_q8a_ref's arithmetic 8 lanes at a time: the conversion rounds to nearest
// even like nearbyint, the packs saturate (as the avx512 variant's conversion does)
// and interleave 128-bit lanes, which the permutation puts back in order; a max is
// exact in any order. The blocks are bit for bit the reference's.
void quantize_q8a_avx2(const float *x, BlockQ8A *y, int64_t n, int64_t group) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < n; g += group) {
        __m256 m = _mm256_setzero_ps();
        for (int64_t i = g; i < g + group; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
        const float d = hmax256(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = g / QK; b < (g + group) / QK; ++b) {
            __m256i q[4];
            for (int h = 0; h < 4; ++h)
                q[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * QK + 8 * h), _mm256_set1_ps(id)));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs),
                                _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            y[b].sum_lo = hsum256_epi32(_mm256_add_epi32(q[0], q[1]));
            y[b].sum = y[b].sum_lo + hsum256_epi32(_mm256_add_epi32(q[2], q[3]));
            y[b].d = d;
            y[b].s = d * static_cast<float>(y[b].sum);
        }
    }
}

// Both activations are g · sigmoid(z), as glu_avx512 computes them.
void glu_avx2(bool gelu, float *gate, const float *up, int64_t n) {
    constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;
    const __m256 one = _mm256_set1_ps(1.0f), k2 = _mm256_set1_ps(-2.0f * kGeluK), c = _mm256_set1_ps(kGeluC);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 minus_z = gelu ? _mm256_mul_ps(_mm256_mul_ps(k2, g), _mm256_fmadd_ps(_mm256_mul_ps(c, g), g, one))
                                    : _mm256_sub_ps(_mm256_setzero_ps(), g);
        const __m256 act = _mm256_div_ps(g, _mm256_add_ps(one, exp256(minus_z)));
        _mm256_storeu_ps(gate + i, up != nullptr ? _mm256_mul_ps(act, _mm256_loadu_ps(up + i)) : act);
    }
    glu_ref(gelu, gate + i, up != nullptr ? up + i : nullptr, n - i); // the rest: rows end on a whole panel, at the same index every time
}

double sum_squares_avx2(const float *x, int n) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int i = 0;
    for (; i + 16 <= n; i += 16) // four chains hide the add latency
        for (int h = 0; h < 4; ++h) {
            const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * h));
            acc[h] = _mm256_fmadd_pd(v, v, acc[h]);
        }
    const __m256d pairs = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(pairs), _mm256_extractf128_pd(pairs, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
    for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

// Rows of the state a scan takes through every token of its run at a time (64 KiB of
// a 128-wide head's state stream from L2 at every token; 16 rows, 8 KiB, stay in L1).
constexpr int kDeltaRows = 16;

void delta_scan_avx2(float *m, const DeltaTokens &x, int n, int hd, float scale) {
    if (hd % 16 != 0) return delta_scan_ref(m, x, n, hd, scale);
    for (int j0 = 0; j0 < hd; j0 += kDeltaRows)
        for (int t = 0; t < n; ++t) {
            const float *q = x.q + t * x.stride, *k = x.k + t * x.stride, *v = x.v + t * x.stride;
            const __m256 vdecay = _mm256_set1_ps(x.decay[t * x.gate_stride]);
            const float beta = x.beta[t * x.gate_stride];
            float *out = x.out + t * x.out_stride;
            // Both passes over a row sum in two chains (even and odd 8-lane slices): one
            // chain waits an FMA's latency at every step of a 128-wide row.
            for (int j = j0; j < std::min(hd, j0 + kDeltaRows); ++j) {
                float *row = m + static_cast<size_t>(j) * hd;
                __m256 mk[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int i = 0; i < hd; i += 16)
                    for (int h = 0; h < 2; ++h) {
                        const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i + 8 * h), vdecay);
                        _mm256_storeu_ps(row + i + 8 * h, r);
                        mk[h] = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i + 8 * h), mk[h]);
                    }
                const __m256 delta = _mm256_set1_ps((v[j] - hsum256(_mm256_add_ps(mk[0], mk[1]))) * beta);
                __m256 mq[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int i = 0; i < hd; i += 16)
                    for (int h = 0; h < 2; ++h) {
                        const __m256 r = _mm256_fmadd_ps(delta, _mm256_loadu_ps(k + i + 8 * h), _mm256_loadu_ps(row + i + 8 * h));
                        _mm256_storeu_ps(row + i + 8 * h, r);
                        mq[h] = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i + 8 * h), mq[h]);
                    }
                out[j] = hsum256(_mm256_add_ps(mq[0], mq[1])) * scale;
            }
        }
}

// Rows of a Mamba-2 head's state a scan takes through every token of its run at a time
// (16 rows of 128 states, 8 KiB, stay in L1 as the delta scan's do). A row sums its
// products in two chains (even and odd 8-lane slices), as delta_scan_avx2's.
constexpr int kSsmRows = 16;

void ssm_scan_avx2(float *s, const SsmTokens &x, int n, int head_dim, int d_state) {
    if (d_state % 16 != 0) return ssm_scan_ref(s, x, n, head_dim, d_state);
    for (int i0 = 0; i0 < head_dim; i0 += kSsmRows)
        for (int t = 0; t < n; ++t) {
            const float *xt = x.x + t * x.stride, *b = x.b + t * x.stride, *c = x.c + t * x.stride;
            const float dt = x.dt[t * x.dt_stride];
            const __m256 decay = _mm256_set1_ps(x.decay[t * x.dt_stride]);
            float *y = x.y + t * x.y_stride;
            for (int i = i0; i < std::min(head_dim, i0 + kSsmRows); ++i) {
                float *row = s + static_cast<size_t>(i) * d_state;
                const __m256 x_dt = _mm256_set1_ps(xt[i] * dt);
                __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int j = 0; j < d_state; j += 16)
                    for (int h = 0; h < 2; ++h) {
                        const int at = j + 8 * h;
                        const __m256 r = _mm256_fmadd_ps(_mm256_loadu_ps(b + at), x_dt,
                                                         _mm256_mul_ps(_mm256_loadu_ps(row + at), decay));
                        _mm256_storeu_ps(row + at, r);
                        sum[h] = _mm256_fmadd_ps(r, _mm256_loadu_ps(c + at), sum[h]);
                    }
                y[i] = hsum256(_mm256_add_ps(sum[0], sum[1]));
            }
        }
}

} // namespace
} // namespace llmd
