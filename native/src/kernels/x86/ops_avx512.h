// ops_avx512.h — the avx512 variant's vector operations (kernels.h): activation
// quantization, GLU, the sum of squares of rmsnorm and the Gated
// DeltaNet and Mamba-2 scans, 16 lanes at a time.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx512.h"

#include <algorithm>
#include <cmath>
#include <immintrin.h>

namespace llmd {
namespace {

// quantize_q8a_ref's arithmetic 16 lanes at a time: the conversion rounds to nearest
// even like nearbyint, and a max is exact in any order, so the blocks are bit for bit
// the reference's.
void quantize_q8a_avx512(const float *x, BlockQ8A *y, int64_t n, int64_t group) {
    for (int64_t g = 0; g < n; g += group) {
        __m512 m = _mm512_setzero_ps();
        for (int64_t i = g; i < g + group; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
        const float d = _mm512_reduce_max_ps(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = g / QK; b < (g + group) / QK; ++b) {
            const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * QK), _mm512_set1_ps(id)));
            const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * QK + 16), _mm512_set1_ps(id)));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(y[b].qs), _mm512_cvtsepi32_epi8(qlo));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(y[b].qs + 16), _mm512_cvtsepi32_epi8(qhi));
            y[b].sum_lo = _mm512_reduce_add_epi32(qlo);
            y[b].sum = y[b].sum_lo + _mm512_reduce_add_epi32(qhi);
            y[b].d = d;
            y[b].s = d * static_cast<float>(y[b].sum);
        }
    }
}

// Both activations are g · sigmoid(z): z = g for SiLU, and for GELU, since
// (1 + tanh(u)) / 2 = sigmoid(2u), z = 2u = 2√(2/π) (g + 0.044715 g³). One exp and
// one division per element, and no cancellation near 0 as 1 + tanh would have.
void glu_avx512(bool gelu, float *gate, const float *up, int64_t n) {
    constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;
    const __m512 one = _mm512_set1_ps(1.0f), k2 = _mm512_set1_ps(-2.0f * kGeluK), c = _mm512_set1_ps(kGeluC);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate + i);
        const __m512 minus_z = gelu ? _mm512_mul_ps(_mm512_mul_ps(k2, g), _mm512_fmadd_ps(_mm512_mul_ps(c, g), g, one))
                                    : _mm512_sub_ps(_mm512_setzero_ps(), g);
        const __m512 act = _mm512_div_ps(g, _mm512_add_ps(one, exp512(minus_z)));
        _mm512_storeu_ps(gate + i, up != nullptr ? _mm512_mul_ps(act, _mm512_loadu_ps(up + i)) : act);
    }
    glu_ref(gelu, gate + i, up != nullptr ? up + i : nullptr, n - i); // the rest: rows end on a whole panel, at the same index every time
}

double sum_squares_avx512(const float *x, int n) {
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()}; // two chains hide the add latency
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int h = 0; h < 2; ++h) {
            const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8 * h));
            acc[h] = _mm512_fmadd_pd(v, v, acc[h]);
        }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(acc[0], acc[1]));
    for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

// Rows of the state a scan takes through every token of its run at a time (as
// delta_scan_avx2: 16 rows of a 128-wide head stay in L1).
constexpr int kDeltaRows = 16;

void delta_scan_avx512(float *m, const DeltaTokens &x, int n, int hd, float scale) {
    if (hd % 16 != 0) return delta_scan_ref(m, x, n, hd, scale);
    for (int j0 = 0; j0 < hd; j0 += kDeltaRows)
        for (int t = 0; t < n; ++t) {
            const float *q = x.q + t * x.stride, *k = x.k + t * x.stride, *v = x.v + t * x.stride;
            const __m512 vdecay = _mm512_set1_ps(x.decay[t * x.gate_stride]);
            const float beta = x.beta[t * x.gate_stride];
            float *out = x.out + t * x.out_stride;
            for (int j = j0; j < std::min(hd, j0 + kDeltaRows); ++j) {
                float *row = m + static_cast<size_t>(j) * hd;
                __m512 mk = _mm512_setzero_ps();
                for (int i = 0; i < hd; i += 16) {
                    const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + i), vdecay);
                    _mm512_storeu_ps(row + i, r);
                    mk = _mm512_fmadd_ps(r, _mm512_loadu_ps(k + i), mk);
                }
                const __m512 delta = _mm512_set1_ps((v[j] - _mm512_reduce_add_ps(mk)) * beta);
                __m512 mq = _mm512_setzero_ps();
                for (int i = 0; i < hd; i += 16) {
                    const __m512 r = _mm512_fmadd_ps(delta, _mm512_loadu_ps(k + i), _mm512_loadu_ps(row + i));
                    _mm512_storeu_ps(row + i, r);
                    mq = _mm512_fmadd_ps(r, _mm512_loadu_ps(q + i), mq);
                }
                out[j] = _mm512_reduce_add_ps(mq) * scale;
            }
        }
}

// Rows of a Mamba-2 head's state a scan takes through every token of its run at a time
// (as ssm_scan_avx2).
constexpr int kSsmRows = 16;

void ssm_scan_avx512(float *s, const SsmTokens &x, int n, int head_dim, int d_state) {
    if (d_state % 16 != 0) return ssm_scan_ref(s, x, n, head_dim, d_state);
    for (int i0 = 0; i0 < head_dim; i0 += kSsmRows)
        for (int t = 0; t < n; ++t) {
            const float *xt = x.x + t * x.stride, *b = x.b + t * x.stride, *c = x.c + t * x.stride;
            const float dt = x.dt[t * x.dt_stride];
            const __m512 decay = _mm512_set1_ps(x.decay[t * x.dt_stride]);
            float *y = x.y + t * x.y_stride;
            for (int i = i0; i < std::min(head_dim, i0 + kSsmRows); ++i) {
                float *row = s + static_cast<size_t>(i) * d_state;
                const __m512 x_dt = _mm512_set1_ps(xt[i] * dt);
                __m512 sum = _mm512_setzero_ps();
                for (int j = 0; j < d_state; j += 16) {
                    const __m512 r = _mm512_fmadd_ps(_mm512_loadu_ps(b + j), x_dt,
                                                     _mm512_mul_ps(_mm512_loadu_ps(row + j), decay));
                    _mm512_storeu_ps(row + j, r);
                    sum = _mm512_fmadd_ps(r, _mm512_loadu_ps(c + j), sum);
                }
                y[i] = _mm512_reduce_add_ps(sum);
            }
        }
}

} // namespace
} // namespace llmd
