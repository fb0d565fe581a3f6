// attention_arm.h — the arm64 variants' attention over a range of cached positions
// (ops/attention.h): a key block's 16 scores in 4 registers per query, keys and values
// of any KV type.
#pragma once

#include "kernels/arm/simd_arm.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>

namespace llmd {
namespace {

constexpr int kBlock = 64; // positions scored before their values are summed

// 4 dot products as scores (attention.h: AttnScale).
inline float32x4_t to_scores(float32x4_t dots, AttnScale s) {
    const float32x4_t x = vmulq_n_f32(dots, s.scale);
    if (s.softcap <= 0.0f) return x;
    return vmulq_n_f32(tanh4(vmulq_n_f32(x, 1.0f / s.softcap)), s.softcap);
}

// The scores of C queries (q, rows of hd) against the key block kb (16 positions,
// dimension-major) into scores[g][0..15]: each dimension's 16 keys are converted
// once and multiply-added into 4 accumulators per query, 16 for C = 4 beside the
// 4 converted keys, so that they all stay in registers.
template <int C>
inline void score_keys(const float *q, int hd, const uint16_t *kb, AttnScale score, float (*scores)[kBlock], int at) {
    float32x4_t acc[C][4];
    for (int g = 0; g < C; ++g)
        for (int i = 0; i < 4; ++i) acc[g][i] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; ++d) {
        float32x4_t kd[4];
        for (int i = 0; i < 4; ++i) kd[i] = f16x4(kb + d * kKeyBlock + 4 * i);
        for (int g = 0; g < C; ++g)
            for (int i = 0; i < 4; ++i) acc[g][i] = vfmaq_n_f32(acc[g][i], kd[i], q[g * hd + d]);
    }
    for (int g = 0; g < C; ++g)
        for (int i = 0; i < 4; ++i) vst1q_f32(&scores[g][at + 4 * i], to_scores(acc[g][i], score));
}

// 8 int8 lanes as two float vectors.
inline void int8x8_f32(int8x8_t b, float32x4_t *lo, float32x4_t *hi) {
    const int16x8_t w = vmovl_s8(b);
    *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
    *hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)));
}

// score_keys for a Q8_0 or Q4_0 key block (T) and the queries quantized alike (q8: hd /
// 32 blocks a query): per 32 dimensions each step takes 4 dimensions of the 16 positions
// (attention.h), 16 bytes for 4 of them, Q8_0's bytes or Q4_0's nibbles (8 above their
// values: a load's low ones dimensions 4a.., its high ones 16 + 4a..; 8 times the query
// block's sum is taken back); each query's 16 exact integer sums in 4 accumulators, then
// times the positions' scales and the query block's scale into the dots.
template <int C, uint32_t T>
inline void score_keys_quant(const BlockQ8A *q8, int hd, const uint8_t *kb, AttnScale score, float (*scores)[kBlock],
                             int at) {
    constexpr bool q8_0 = T == GGML_Q8_0;
    const int nb = hd / QK;
    float32x4_t dots[C][4];
    for (int g = 0; g < C; ++g)
        for (int i = 0; i < 4; ++i) dots[g][i] = vdupq_n_f32(0.0f);
    for (int c = 0; c < nb; ++c) {
        const uint8_t *gb = kb + c * kKeyBlock * kv_row_bytes(T, QK), *qs = gb + 2 * kKeyBlock;
        int32x4_t acc[C][4];
        for (int g = 0; g < C; ++g)
            for (int i = 0; i < 4; ++i) acc[g][i] = vdupq_n_s32(0);
        for (int s = 0; s < QK / 4; ++s) { // dimensions 4 s .. 4 s + 3
            int8x16_t k4[4];
            for (int i = 0; i < 4; ++i) {
                const uint8x16_t b = load_u8(qs + (q8_0 ? s : s % 4) * 4 * kKeyBlock + 16 * i);
                k4[i] = as_s8(q8_0 ? b : s < 4 ? vandq_u8(b, vdupq_n_u8(0x0f)) : vshrq_n_u8(b, 4));
            }
            for (int g = 0; g < C; ++g) {
                int32_t q4;
                std::memcpy(&q4, q8[g * nb + c].qs + 4 * s, 4);
                const int8x16_t qb = vreinterpretq_s8_s32(vdupq_n_s32(q4));
                for (int i = 0; i < 4; ++i) acc[g][i] = dot16_by4(acc[g][i], k4[i], qb);
            }
        }
        const uint16_t *d = reinterpret_cast<const uint16_t *>(gb);
        for (int g = 0; g < C; ++g) {
            const BlockQ8A &b = q8[g * nb + c];
            const int32x4_t taken = vdupq_n_s32(q8_0 ? 0 : 8 * b.sum);
            for (int i = 0; i < 4; ++i)
                dots[g][i] = vfmaq_f32(dots[g][i], vcvtq_f32_s32(vsubq_s32(acc[g][i], taken)),
                                       vmulq_n_f32(f16x4(d + 4 * i), b.d));
        }
    }
    for (int g = 0; g < C; ++g)
        for (int i = 0; i < 4; ++i) vst1q_f32(&scores[g][at + 4 * i], to_scores(dots[g][i], score));
}

// Queries g .. g + C - 1 against a key block of the keys' type.
template <int C>
inline void score_call(const float *q, const BlockQ8A *q8, int g, int hd, const uint8_t *kb, uint32_t type,
                       AttnScale score, float (*scores)[kBlock], int at) {
    if (type == GGML_F16) score_keys<C>(q + g * hd, hd, reinterpret_cast<const uint16_t *>(kb), score, scores + g, at);
    else if (type == GGML_Q8_0) score_keys_quant<C, GGML_Q8_0>(q8 + g * (hd / QK), hd, kb, score, scores + g, at);
    else score_keys_quant<C, GGML_Q4_0>(q8 + g * (hd / QK), hd, kb, score, scores + g, at);
}

// Dimensions 8 s .. 8 s + 7 of a Q8_0 or Q4_0 value block (qs: its quants) as floats.
inline void value_eight(const uint8_t *qs, uint32_t type, int s, float32x4_t *lo, float32x4_t *hi) {
    if (type == GGML_Q8_0) return int8x8_f32(vld1_s8(reinterpret_cast<const int8_t *>(qs + 8 * s)), lo, hi);
    const uint8x8_t b = vld1_u8(qs + 8 * (s % 2));
    const uint8x8_t u = s < 2 ? vand_u8(b, vdup_n_u8(0x0f)) : vshr_n_u8(b, 4);
    int8x8_f32(vsub_s8(vreinterpret_s8_u8(u), vdup_n_s8(8)), lo, hi);
}

void attend_neon(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd, KVTypes types,
                 AttnScale score, float *out, AttnPartial *part, bool cold) {
    const size_t k_row = kv_row_bytes(types.k, hd), v_row = kv_row_bytes(types.v, hd);
    alignas(16) float scores[kMaxGroup][kBlock];
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
            // Scores, a key block at a time, for the queries 4 at a time.
            for (int i0 = 0; i0 < len; i0 += kKeyBlock) {
                const uint8_t *kb = k + static_cast<size_t>(p0 + i0) * k_row;
                int g = 0;
                for (; g + 4 <= n_q; g += 4) score_call<4>(q, q8, g, hd, kb, types.k, score, scores, i0);
                switch (n_q - g) {
                case 3: score_call<3>(q, q8, g, hd, kb, types.k, score, scores, i0); break;
                case 2: score_call<2>(q, q8, g, hd, kb, types.k, score, scores, i0); break;
                case 1: score_call<1>(q, q8, g, hd, kb, types.k, score, scores, i0); break;
                default: break;
                }
            }
            // Positions past the range (a block's unwritten rest, and the block's tail) score -inf.
            for (int g = 0; g < n_q; ++g) std::fill(&scores[g][len], &scores[g][kBlock], -INFINITY);
            // Softmax weights, rescaling what was summed so far when the max grows.
            for (int g = 0; g < n_q; ++g) {
                float32x4_t bm = vdupq_n_f32(-INFINITY);
                for (int i = 0; i < kBlock; i += 4) bm = vmaxq_f32(bm, vld1q_f32(&scores[g][i]));
                const float new_max = std::max(mx[g], vmaxvq_f32(bm));
                if (new_max > mx[g]) {
                    const float shrink = std::exp(mx[g] - new_max); // 0 on the first block
                    sum[g] *= shrink;
                    for (int d = 0; d < hd; ++d) out[g * hd + d] *= shrink;
                    mx[g] = new_max;
                }
                float32x4_t s = vdupq_n_f32(0.0f);
                for (int i = 0; i < kBlock; i += 4) {
                    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(&scores[g][i]), vdupq_n_f32(new_max)));
                    vst1q_f32(&scores[g][i], e);
                    s = vaddq_f32(s, e);
                }
                sum[g] += vaddvq_f32(s);
            }
            // Values, 8 dimensions at a time: the group's outputs stay in registers while
            // each value row's slice is converted once for all of them (a quantized row's
            // weighted by its block's scale).
            const size_t block = kv_row_bytes(types.v, QK);
            for (int d = 0; d < hd; d += 8) {
                float32x4_t acc[kMaxGroup][2];
                for (int g = 0; g < n_q; ++g)
                    for (int h = 0; h < 2; ++h) acc[g][h] = vld1q_f32(out + g * hd + d + 4 * h);
                for (int i = 0; i < len; ++i) {
                    const uint8_t *row = v + static_cast<size_t>(p0 + i) * v_row;
                    float32x4_t v0, v1;
                    float w = 1.0f;
                    if (types.v == GGML_F16) {
                        const uint16_t *vr = reinterpret_cast<const uint16_t *>(row) + d;
                        v0 = f16x4(vr);
                        v1 = f16x4(vr + 4);
                    } else {
                        const uint8_t *b = row + d / QK * block;
                        w = vgetq_lane_f32(f16x4(reinterpret_cast<const uint16_t *>(b)), 0);
                        value_eight(b + 2, types.v, d % QK / 8, &v0, &v1);
                    }
                    for (int g = 0; g < n_q; ++g) {
                        const float s = types.v == GGML_F16 ? scores[g][i] : scores[g][i] * w;
                        acc[g][0] = vfmaq_n_f32(acc[g][0], v0, s);
                        acc[g][1] = vfmaq_n_f32(acc[g][1], v1, s);
                    }
                }
                for (int g = 0; g < n_q; ++g)
                    for (int h = 0; h < 2; ++h) vst1q_f32(out + g * hd + d + 4 * h, acc[g][h]);
            }
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}

void attend_range_neon(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                       KVTypes types, AttnScale score, float *out, AttnPartial *part, bool cold) {
    if (hd % 8 != 0 || n_q > kMaxGroup)
        return attend_range_ref(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
    attend_neon(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
}

} // namespace
} // namespace llmd
