// attention.cpp — see attention.h.
#include "attention.h"

#include "quants.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include "simd.h"
#define LLMD_ATTN_AVX512 1
#endif

namespace llmd {

void attend_range_ref(const float *q, int n_q, const uint16_t *k, const uint16_t *v, int n_pos, int hd,
                      size_t stride, float scale, float *out, AttnPartial *part) {
    std::vector<double> scores(static_cast<size_t>(n_pos));
    for (int g = 0; g < n_q; ++g) {
        const float *qg = q + g * hd;
        double mx = -INFINITY;
        for (int p = 0; p < n_pos; ++p) {
            double s = 0.0;
            for (int d = 0; d < hd; ++d) s += static_cast<double>(qg[d]) * fp16_to_fp32(k[p * stride + d]);
            scores[p] = s * scale;
            mx = std::max(mx, scores[p]);
        }
        double sum = 0.0;
        std::vector<double> acc(static_cast<size_t>(hd), 0.0);
        for (int p = 0; p < n_pos; ++p) {
            const double e = std::exp(scores[p] - mx);
            sum += e;
            for (int d = 0; d < hd; ++d) acc[d] += e * fp16_to_fp32(v[p * stride + d]);
        }
        for (int d = 0; d < hd; ++d) out[g * hd + d] = static_cast<float>(acc[d]);
        part[g] = {static_cast<float>(mx), static_cast<float>(sum)};
    }
}

#ifdef LLMD_ATTN_AVX512
namespace {

constexpr int kBlock = 64;        // positions scored before their values are summed
constexpr int kMaxHeadDim = 256;  // of the fast kernel; larger heads use the reference

// Lane j of the result is the sum of v[j]'s 16 lanes: a transposing tree of
// shuffles and adds, far cheaper than 16 separate horizontal sums.
inline __m512 hsum16(const __m512 *v) {
    __m512 w[8], x[4];
    for (int k = 0; k < 8; ++k) // per 128-bit lane: v2k even, v2k+1 even, v2k odd, v2k+1 odd
        w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int m = 0; m < 4; ++m) { // per 128-bit lane: the lane's sums of v4m .. v4m+3
        const __m512d a = _mm512_castps_pd(w[2 * m]), b = _mm512_castps_pd(w[2 * m + 1]);
        x[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88), _mm512_shuffle_f32x4(x[0], x[1], 0xdd));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88), _mm512_shuffle_f32x4(x[2], x[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xdd));
}

// G query heads, or n_q of them when G is 0: a fixed G keeps the group's value
// sums in registers.
template <int G>
void attend(const float *q, int n_q_, const uint16_t *k, const uint16_t *v, int n_pos, int hd, size_t stride,
            float scale, float *out, AttnPartial *part) {
    const int n_q = G > 0 ? G : n_q_;
    alignas(64) float scores[kMaxGroup][kBlock];
    alignas(64) float keys[16][kMaxHeadDim]; // 16 key rows as floats
    float mx[kMaxGroup], sum[kMaxGroup];
    std::fill(mx, mx + n_q, -INFINITY);
    std::fill(sum, sum + n_q, 0.0f);
    std::fill(out, out + n_q * hd, 0.0f);
    for (int p0 = 0; p0 < n_pos; p0 += kBlock) {
        const int len = std::min(kBlock, n_pos - p0);
        // Scores, 16 rows at a time: each key row is converted once for all the
        // group's queries, and 16 dot products are summed across lanes together.
        for (int i0 = 0; i0 < len; i0 += 16) {
            const int rows = std::min(16, len - i0);
            for (int i = 0; i < rows; ++i)
                for (int d = 0; d < hd; d += 16)
                    _mm512_store_ps(&keys[i][d], _mm512_cvtph_ps(_mm256_loadu_si256(
                                                     reinterpret_cast<const __m256i *>(k + (p0 + i0 + i) * stride + d))));
            for (int g = 0; g < n_q; ++g) {
                __m512 acc[16];
                for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
                for (int d = 0; d < hd; d += 16) {
                    const __m512 qd = _mm512_loadu_ps(q + g * hd + d);
                    for (int i = 0; i < rows; ++i) acc[i] = _mm512_fmadd_ps(qd, _mm512_load_ps(&keys[i][d]), acc[i]);
                }
                const __m512 dots = _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(scale));
                const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
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
                    _mm256_loadu_si256(reinterpret_cast<const __m256i *>(v + (p0 + i) * stride + d)));
                for (int g = 0; g < n_q; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g][i]), vf, acc[g]);
            }
            for (int g = 0; g < n_q; ++g) _mm512_storeu_ps(out + g * hd + d, acc[g]);
        }
    }
    for (int g = 0; g < n_q; ++g) part[g] = {mx[g], sum[g]};
}

} // namespace

void attend_range(const float *q, int n_q, const uint16_t *k, const uint16_t *v, int n_pos, int hd,
                  size_t stride, float scale, float *out, AttnPartial *part) {
    if (hd % 16 != 0 || hd > kMaxHeadDim || n_q > kMaxGroup) {
        attend_range_ref(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
        return;
    }
    switch (n_q) { // the group sizes of common models
    case 1: return attend<1>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 2: return attend<2>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 3: return attend<3>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 4: return attend<4>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 6: return attend<6>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 7: return attend<7>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    case 8: return attend<8>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    default: return attend<0>(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
    }
}

#else

void attend_range(const float *q, int n_q, const uint16_t *k, const uint16_t *v, int n_pos, int hd,
                  size_t stride, float scale, float *out, AttnPartial *part) {
    attend_range_ref(q, n_q, k, v, n_pos, hd, stride, scale, out, part);
}

#endif

void attend_combine(const float *outs, size_t out_stride, const AttnPartial *parts, size_t part_stride,
                    int n_parts, int hd, float *y) {
    float mx = -INFINITY;
    for (int i = 0; i < n_parts; ++i) mx = std::max(mx, parts[i * part_stride].max);
    std::fill(y, y + hd, 0.0f);
    float total = 0.0f;
    for (int i = 0; i < n_parts; ++i) {
        const AttnPartial &part = parts[i * part_stride];
        if (part.sum == 0.0f) continue; // an empty range
        const float w = std::exp(part.max - mx);
        total += w * part.sum;
        for (int d = 0; d < hd; ++d) y[d] += w * outs[i * out_stride + d];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = 0; d < hd; ++d) y[d] *= inv;
}

} // namespace llmd
