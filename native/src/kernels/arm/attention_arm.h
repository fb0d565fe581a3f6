// attention_arm.h — the arm64 variants' attention over a range of cached positions
// (ops/attention.h): a key block's 16 scores in 4 registers per query.
#pragma once

#include "kernels/arm/simd_arm.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>

namespace llmd {
namespace {

constexpr int kBlock = 64; // positions scored before their values are summed

// The scores of C queries (q, rows of hd) against the key block kb (16 positions,
// dimension-major) into scores[g][0..15]: each dimension's 16 keys are converted
// once and multiply-added into 4 accumulators per query, 16 for C = 4 beside the
// 4 converted keys, so that they all stay in registers.
template <int C>
inline void score_keys(const float *q, int hd, const uint16_t *kb, float scale, float (*scores)[kBlock], int at) {
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
        for (int i = 0; i < 4; ++i) vst1q_f32(&scores[g][at + 4 * i], vmulq_n_f32(acc[g][i], scale));
}

void attend_neon(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                 AttnPartial *part) {
    alignas(16) float scores[kMaxGroup][kBlock];
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
            // Scores, a key block at a time, for the queries 4 at a time.
            for (int i0 = 0; i0 < len; i0 += kKeyBlock) {
                const uint16_t *kb = k + static_cast<size_t>(p0 + i0) * hd;
                int g = 0;
                for (; g + 4 <= n_q; g += 4) score_keys<4>(q + g * hd, hd, kb, scale, scores + g, i0);
                switch (n_q - g) {
                case 3: score_keys<3>(q + g * hd, hd, kb, scale, scores + g, i0); break;
                case 2: score_keys<2>(q + g * hd, hd, kb, scale, scores + g, i0); break;
                case 1: score_keys<1>(q + g * hd, hd, kb, scale, scores + g, i0); break;
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
            // each value row's slice is converted once for all of them.
            for (int d = 0; d < hd; d += 8) {
                float32x4_t acc[kMaxGroup][2];
                for (int g = 0; g < n_q; ++g)
                    for (int h = 0; h < 2; ++h) acc[g][h] = vld1q_f32(out + g * hd + d + 4 * h);
                for (int i = 0; i < len; ++i) {
                    const uint16_t *vr = v + static_cast<size_t>(p0 + i) * hd + d;
                    const float32x4_t v0 = f16x4(vr), v1 = f16x4(vr + 4);
                    for (int g = 0; g < n_q; ++g) {
                        acc[g][0] = vfmaq_n_f32(acc[g][0], v0, scores[g][i]);
                        acc[g][1] = vfmaq_n_f32(acc[g][1], v1, scores[g][i]);
                    }
                }
                for (int g = 0; g < n_q; ++g)
                    for (int h = 0; h < 2; ++h) vst1q_f32(out + g * hd + d + 4 * h, acc[g][h]);
            }
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}

void attend_range_neon(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                       AttnPartial *part) {
    if (hd % 8 != 0 || n_q > kMaxGroup) return attend_range_ref(q, n_q, runs, n_runs, hd, scale, out, part);
    attend_neon(q, n_q, runs, n_runs, hd, scale, out, part);
}

} // namespace
} // namespace llmd
