// ops_arm.h — the arm64 variants' vector operations (kernels.h): activation
// quantization, GLU, the sum of squares of rmsnorm, the KV cache's writes and the Gated
// DeltaNet scan, 4 lanes at a time.
#pragma once

#include "kernels/arm/simd_arm.h"
#include "kernels/kernels.h"
#include "quants/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace llmd {
namespace {

// quantize_q8a_ref's arithmetic 4 lanes at a time: FMAXNM ignores a NaN as fmax
// does, a max is exact in any order, FCVTNS rounds to nearest even like nearbyint,
// and the int sums are exact: the blocks are bit for bit the reference's.
void quantize_q8a_neon(const float *x, BlockQ8A *y, int64_t n, int64_t group) {
    for (int64_t g = 0; g < n; g += group) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int64_t i = g; i < g + group; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i)));
        const float d = vmaxnmvq_f32(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = g / QK; b < (g + group) / QK; ++b) {
            int32x4_t q[8];
            for (int i = 0; i < 8; ++i) q[i] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + b * QK + 4 * i), id));
            int16x8_t h[4];
            for (int i = 0; i < 4; ++i) h[i] = vcombine_s16(vmovn_s32(q[2 * i]), vmovn_s32(q[2 * i + 1]));
            vst1q_s8(y[b].qs, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
            vst1q_s8(y[b].qs + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
            y[b].sum_lo = vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
            y[b].sum = y[b].sum_lo + vaddvq_s32(vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
            y[b].d = d;
            y[b].s = d * static_cast<float>(y[b].sum);
        }
    }
}

// Both activations are g · sigmoid(z): z = g for SiLU, and for GELU, since
// (1 + tanh(u)) / 2 = sigmoid(2u), z = 2u = 2√(2/π) (g + 0.044715 g³). One exp and
// one division per element, and no cancellation near 0 as 1 + tanh would have.
void glu_neon(bool gelu, float *gate, const float *up, int64_t n) {
    constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t minus_z =
            gelu ? vmulq_f32(vmulq_n_f32(g, -2.0f * kGeluK), vfmaq_f32(one, vmulq_n_f32(g, kGeluC), g)) : vnegq_f32(g);
        const float32x4_t act = vdivq_f32(g, vaddq_f32(one, exp4(minus_z)));
        vst1q_f32(gate + i, up != nullptr ? vmulq_f32(act, vld1q_f32(up + i)) : act);
    }
    glu_ref(gelu, gate + i, up != nullptr ? up + i : nullptr, n - i); // the rest: at the same index every time
}

double sum_squares_neon(const float *x, int n) {
    float64x2_t acc[2] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0)}; // two chains hide the add latency
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
        acc[0] = vfmaq_f64(acc[0], lo, lo);
        acc[1] = vfmaq_f64(acc[1], hi, hi);
    }
    double ss = vaddvq_f64(vaddq_f64(acc[0], acc[1]));
    for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

// FCVTN rounds by the FPCR's mode, which is round to nearest even unless a program
// changes it (none of the engine's callers does).
// quantize_row_q8_0's arithmetic on 32 floats: the max is exact in any order, d and
// 1/d are the same divisions, and FCVTAS rounds halves away from zero as std::round.
void kv_block_q8_0(const float *x, uint8_t *out) {
    float32x4_t v[8], m = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; ++i) {
        v[i] = vld1q_f32(x + 4 * i);
        m = vmaxnmq_f32(m, vabsq_f32(v[i]));
    }
    const float d = vmaxnmvq_f32(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    int16x8_t h[4];
    for (int i = 0; i < 4; ++i)
        h[i] = vcombine_s16(vmovn_s32(vcvtaq_s32_f32(vmulq_n_f32(v[2 * i], id))),
                            vmovn_s32(vcvtaq_s32_f32(vmulq_n_f32(v[2 * i + 1], id))));
    vst1q_s8(reinterpret_cast<int8_t *>(out + 2), vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(reinterpret_cast<int8_t *>(out + 18), vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
}

// quantize_row_q4_0_kv's fit (quantize.h): the 8 candidates' sums a lane each, over
// the block's values in order, so each lane's arithmetic is the reference's.
void kv_block_q4_0(const float *x, uint8_t *out) {
    float32x4_t v[8], m = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; ++i) {
        v[i] = vld1q_f32(x + 4 * i);
        m = vmaxnmq_f32(m, vabsq_f32(v[i]));
    }
    const float amax = vmaxnmvq_f32(m);
    int first = 0;
    while (first < QK && std::fabs(x[first]) != amax) ++first;
    static_assert(kQ4KVCandidates == 8, "two registers of candidates");
    float iscale[8], sxl[8], sll[8];
    if (first == QK || !q4_0_kv_candidates(x[first], iscale))
        return quantize_row_q4_0_kv(x, out, QK); // a block of zeros (or with a NaN): the reference writes it
    // nearest(s x) within [-8, 7], as std::min / std::max clamp (a NaN becomes 7)
    const auto code = [](float32x4_t s, float x) {
        const float32x4_t l = vrndnq_f32(vmulq_n_f32(s, x));
        return vmaxnmq_f32(vminnmq_f32(l, vdupq_n_f32(7.0f)), vdupq_n_f32(-8.0f));
    };
    const float32x4_t is[2] = {vld1q_f32(iscale), vld1q_f32(iscale + 4)};
    float32x4_t xl[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}, ll[2] = {xl[0], xl[1]};
    for (int j = 0; j < QK; ++j)
        for (int h = 0; h < 2; ++h) {
            const float32x4_t l = code(is[h], x[j]);
            xl[h] = vfmaq_n_f32(xl[h], l, x[j]);
            ll[h] = vfmaq_f32(ll[h], l, l);
        }
    for (int h = 0; h < 2; ++h) {
        vst1q_f32(sxl + 4 * h, xl[h]);
        vst1q_f32(sll + 4 * h, ll[h]);
    }
    const int c = q4_0_kv_pick(sxl, sll);
    const uint16_t dh = fp32_to_fp16(sxl[c] / sll[c]);
    std::memcpy(out, &dh, 2);
    uint16x8_t h[4];
    for (int i = 0; i < 4; ++i) {
        const auto stored = [&](float32x4_t x4) {
            return vcvtq_u32_f32(vaddq_f32(code(x4, iscale[c]), vdupq_n_f32(8.0f)));
        };
        h[i] = vcombine_u16(vmovn_u32(stored(v[2 * i])), vmovn_u32(stored(v[2 * i + 1])));
    }
    const uint8x16_t lo8 = vcombine_u8(vmovn_u16(h[0]), vmovn_u16(h[1]));
    const uint8x16_t hi8 = vcombine_u8(vmovn_u16(h[2]), vmovn_u16(h[3]));
    vst1q_u8(out + 2, vorrq_u8(lo8, vshlq_n_u8(hi8, 4)));
}

// The KV cache's writes (kernels.h: kv_row), bit for bit the reference's.
void kv_row_neon(uint32_t type, const float *x, uint8_t *y, int n) {
    if (type == GGML_Q8_0) {
        for (int i = 0; i < n; i += QK, y += 34) kv_block_q8_0(x + i, y);
        return;
    }
    if (type == GGML_Q4_0) {
        for (int i = 0; i < n; i += QK, y += 18) kv_block_q4_0(x + i, y);
        return;
    }
    uint16_t *h = reinterpret_cast<uint16_t *>(y); // F16 rows lie at even addresses
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    to_f16_ref(x + i, h + i, n - i);
}

// Rows of the state a scan takes through every token of its run at a time (as
// delta_scan_avx2: 16 rows of a 128-wide head stay in L1).
constexpr int kDeltaRows = 16;

void delta_scan_neon(float *m, const DeltaTokens &x, int n, int hd, float scale) {
    if (hd % 4 != 0) return delta_scan_ref(m, x, n, hd, scale);
    for (int j0 = 0; j0 < hd; j0 += kDeltaRows)
        for (int t = 0; t < n; ++t) {
            const float *q = x.q + t * x.stride, *k = x.k + t * x.stride, *v = x.v + t * x.stride;
            const float decay = x.decay[t * x.gate_stride], beta = x.beta[t * x.gate_stride];
            float *out = x.out + t * x.out_stride;
            for (int j = j0; j < std::min(hd, j0 + kDeltaRows); ++j) {
                float *row = m + static_cast<size_t>(j) * hd;
                float32x4_t mk = vdupq_n_f32(0.0f);
                for (int i = 0; i < hd; i += 4) {
                    const float32x4_t r = vmulq_n_f32(vld1q_f32(row + i), decay);
                    vst1q_f32(row + i, r);
                    mk = vfmaq_f32(mk, r, vld1q_f32(k + i));
                }
                const float delta = (v[j] - vaddvq_f32(mk)) * beta;
                float32x4_t mq = vdupq_n_f32(0.0f);
                for (int i = 0; i < hd; i += 4) {
                    const float32x4_t r = vfmaq_n_f32(vld1q_f32(row + i), vld1q_f32(k + i), delta);
                    vst1q_f32(row + i, r);
                    mq = vfmaq_f32(mq, r, vld1q_f32(q + i));
                }
                out[j] = vaddvq_f32(mq) * scale;
            }
        }
}

} // namespace
} // namespace llmd
