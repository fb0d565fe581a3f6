// kv_avx2.h — the x86 variants' KV cache writes (kernels.h: kv_row): a key or value
// as a row of F16, Q8_0 or Q4_0 (quantize.h: quantize_row_q4_0_kv), bit for bit the reference's.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx2.h"
#include "quants/quantize.h"

#include <cmath>
#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {

// A block's 32 floats into v, and their largest magnitude (exact in any order).
inline float load_block(const float *x, __m256 v[4]) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int h = 0; h < 4; ++h) {
        v[h] = _mm256_loadu_ps(x + 8 * h);
        m = _mm256_max_ps(m, _mm256_and_ps(v[h], magnitude));
    }
    return hmax256(m);
}

// quantize_row_q8_0's arithmetic on 32 floats: the max is exact in any order, d and
// 1/d are the same divisions, and rounding halves away from zero is the truncation
// plus one step away where the (exact) remainder reaches a half.
void kv_block_q8_0(const float *x, uint8_t *out) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    const float amax = load_block(x, v);
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    __m256i q[4];
    for (int h = 0; h < 4; ++h) {
        const __m256 s = _mm256_mul_ps(v[h], _mm256_set1_ps(id));
        const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 half = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(s, t), magnitude), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
        const __m256 step = _mm256_or_ps(_mm256_andnot_ps(magnitude, s), _mm256_set1_ps(1.0f)); // ±1 with s's sign
        q[h] = _mm256_cvtps_epi32(_mm256_add_ps(t, _mm256_and_ps(half, step)));
    }
    // The packs interleave 128-bit lanes; the permutation puts them back in order.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 2),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// quantize_row_q4_0_kv's fit (quantize.h): the 8 candidates' sums a lane each, over
// the block's values in order, so each lane's arithmetic is the reference's.
void kv_block_q4_0(const float *x, uint8_t *out) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    const float amax = load_block(x, v);
    uint32_t first = 0; // lanes whose magnitude is the max
    for (int h = 0; h < 4; ++h)
        first |= static_cast<uint32_t>(_mm256_movemask_ps(
                     _mm256_cmp_ps(_mm256_and_ps(v[h], magnitude), _mm256_set1_ps(amax), _CMP_EQ_OQ)))
                 << (8 * h);
    static_assert(kQ4KVCandidates == 8, "one register of candidates");
    alignas(32) float iscale[8], sxl[8], sll[8];
    if (first == 0 || !q4_0_kv_candidates(x[__builtin_ctz(first)], iscale))
        return quantize_row_q4_0_kv(x, out, QK); // a block of zeros (or with a NaN): the reference writes it
    // nearest(s x) within [-8, 7], as std::min / std::max clamp (a NaN becomes 7)
    const auto code = [](__m256 s, __m256 x) {
        const __m256 l = _mm256_round_ps(_mm256_mul_ps(s, x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        return _mm256_max_ps(_mm256_min_ps(l, _mm256_set1_ps(7.0f)), _mm256_set1_ps(-8.0f));
    };
    const __m256 is = _mm256_load_ps(iscale);
    __m256 xl = _mm256_setzero_ps(), ll = _mm256_setzero_ps();
    for (int j = 0; j < QK; ++j) {
        const __m256 xj = _mm256_set1_ps(x[j]);
        const __m256 l = code(is, xj);
        xl = _mm256_fmadd_ps(xj, l, xl);
        ll = _mm256_fmadd_ps(l, l, ll);
    }
    _mm256_store_ps(sxl, xl);
    _mm256_store_ps(sll, ll);
    const int c = q4_0_kv_pick(sxl, sll);
    const float d = sxl[c] / sll[c];
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    const __m256 ic = _mm256_set1_ps(iscale[c]);
    __m256i q[4];
    for (int h = 0; h < 4; ++h)
        q[h] = _mm256_cvtps_epi32(_mm256_add_ps(code(ic, v[h]), _mm256_set1_ps(8.0f)));
    const __m256i lo16 = _mm256_packs_epi32(q[0], q[1]), hi16 = _mm256_packs_epi32(q[2], q[3]); // lanes interleaved
    const __m256i both = _mm256_or_si256(lo16, _mm256_slli_epi16(hi16, 4));
    const __m256i ordered = _mm256_permute4x64_epi64(both, 0xd8); // elements 0..15 in order
    const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(ordered), _mm256_extracti128_si256(ordered, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out + 2), bytes);
}

void kv_row_x86(uint32_t type, const float *x, uint8_t *y, int n) {
    if (type == GGML_Q8_0) {
        for (int i = 0; i < n; i += QK, y += 34) kv_block_q8_0(x + i, y);
    } else if (type == GGML_Q4_0) {
        for (int i = 0; i < n; i += QK, y += 18) kv_block_q4_0(x + i, y);
    } else {
        uint16_t *h = reinterpret_cast<uint16_t *>(y); // F16 rows lie at even addresses
        int i = 0;
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(h + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        to_f16_ref(x + i, h + i, n - i);
    }
}

} // namespace
} // namespace llmd
