// rows_avx2.h — the row dot products of the x86 variants (kernels.h), in 256-bit
// registers: AVX2 multiplies bytes through vpmaddubsw, the avx-vnni and avx512
// variants (built with those instructions) through vpdpbusd. Each is checked against
// its type's scalar reference by tests/test_kernels.py (the row kernels, packed off)
// in every variant this CPU runs.
//
// Every type unpacks its blocks in vector registers: nibbles by mask and shift,
// the fifth bits of Q5_0/Q5_1 spread from their word by a byte shuffle, the codes
// of IQ4_NL, IQ4_XS and MXFP4 looked up in a 16-byte table (vpshufb), the high-bit
// planes of Q3_K, Q5_K and Q6_K shifted into place, the K-quants' packed scales
// unpacked a word at a time. Every row sums its blocks in one fixed order, so a
// token's result does not depend on the batch it is in.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/simd_avx2.h"

#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {

// Sum of u8 × s8 products in groups of four, as 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) { return dot4_u8s8(_mm256_setzero_si256(), u, s); }

// s8 × s8 through the unsigned form: |a| × (b · sign(a)).
inline __m256i dot_s8s8(__m256i a, __m256i b) {
    return dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// 16 packed nibble bytes → 32 bytes: low nibbles first, then high nibbles.
inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

inline float half(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

float dot_q4_0_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; ++b, w += 18) {
        const __m256i q4 = _mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q4, load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
    }
    return hsum(acc);
}

float dot_q4_1_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float offset = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, w += 20) {
        const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(unpack_nibbles(w + 4), load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
        offset += half(w + 2) * x[b].s;
    }
    return hsum(acc) + offset;
}

float dot_q8_0_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; ++b, w += 34) {
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(load256(w + 2), load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
    }
    return hsum(acc);
}

// ---- blocks of 32 with their own scale -------------------------------------

// The fifth bits of Q5_0 and Q5_1 (bit i of the word at qh for element i) as 0x10
// in byte i: each byte picks the word's byte i / 8, then tests bit i % 8.
inline __m256i fifth_bits(const uint8_t *qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// A 16-entry table of int8 codes in both 128-bit lanes, as vpshufb looks it up.
inline __m256i code_table(const int8_t *table) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(table)));
}

float dot_q5_0_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; ++b, w += 22) {
        const __m256i u = _mm256_or_si256(unpack_nibbles(w + 6), fifth_bits(w + 2));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(_mm256_sub_epi8(u, _mm256_set1_epi8(16)), load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
    }
    return hsum(acc);
}

float dot_q5_1_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float offset = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, w += 24) {
        const __m256i u = _mm256_or_si256(unpack_nibbles(w + 8), fifth_bits(w + 4));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(u, load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
        offset += half(w + 2) * x[b].s;
    }
    return hsum(acc) + offset;
}

// IQ4_NL: nibbles are codes into Table (kIQ4NL, quants.cpp).
template <const int8_t (&Table)[16]>
float dot_iq4_nl_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i table = code_table(Table);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; ++b, w += 18) {
        const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 2));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[b].d), p, acc);
    }
    return hsum(acc);
}

// 2^(e - 128), MXFP4's scale 2^(e - 127) halved as its doubled code table wants;
// e = 0 and 1 give the subnormals 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e >= 2 ? static_cast<uint32_t>(e - 1) << 23 : 0x00800000u >> (2 - e);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// MXFP4: an e8m0 exponent, then nibbles that are codes into Table (kFP4, quants.cpp).
template <const int8_t (&Table)[16]>
float dot_mxfp4_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i table = code_table(Table);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; ++b, w += 17) {
        const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 1));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load256(x[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(e8m0_half(w[0]) * x[b].d), p, acc);
    }
    return hsum(acc);
}

// ---- K-quant super-blocks of 256 -----------------------------------------------
//
// x is quantized with one scale per 256 elements (Activation::Q8K), so a super-block's
// integer products, each sub-block's times its integer scale, add up exactly in int32
// lanes (at most 256 × 127 × 128 × 64 in magnitude) before one float multiply by
// d × x.d. Weights with an offset (Q3_K's q = u - 4, Q6_K's q = u - 32) multiply as
// the unsigned u, and the offset comes off exactly through x's block sums.

// The u8 × s8 products of 32 elements summed in pairs (int16: every caller keeps
// u <= 128, so no pair saturates), times an int16 scale per 16 elements (`scales`
// holds the first half's in its low 128 bits): 8 int32 lanes.
inline __m256i dot_scaled(__m256i u, __m256i s, __m256i scales) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales);
}
inline __m256i scales16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(hi)), _mm_set1_epi16(static_cast<int16_t>(lo)));
}

inline int32_t hsum_i32(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 1));
    return _mm_cvtsi128_si32(r);
}

// Sum over x's 16-element halves of the sub-block scales times the halves' sums.
inline int32_t scaled_sums(const BlockQ8A &x, int lo, int hi) { return lo * x.sum_lo + hi * (x.sum - x.sum_lo); }

// The 6-bit scales and mins of Q4_K and Q5_K from their 12 bytes, four at a time:
// bytes 0..3 (4..7) hold scales (mins) 0..3 and in their top two bits those of 4..7,
// whose low nibbles are in bytes 8..11.
inline void scales_mins_k4(const uint8_t *packed, uint8_t scale[8], uint8_t min[8]) {
    uint32_t s[3];
    std::memcpy(s, packed, 12);
    const uint32_t scales[2] = {s[0] & 0x3f3f3f3f, (s[2] & 0x0f0f0f0f) | (s[0] >> 6 & 0x03030303) << 4};
    const uint32_t mins[2] = {s[1] & 0x3f3f3f3f, (s[2] >> 4 & 0x0f0f0f0f) | (s[1] >> 6 & 0x03030303) << 4};
    std::memcpy(scale, scales, 8);
    std::memcpy(min, mins, 8);
}

// Q4_K (144 bytes) and Q5_K (176): sub-blocks 2i and 2i + 1 are the low and high
// nibbles of the same 32 bytes. Q5_K adds bit j of the 32 bytes at qh as sub-block j's
// fifth bit: qh shifts right as j advances, bringing bit j to bit 0 (then to 0x10).
template <bool kFifth> float dot_q4_5_k_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    constexpr int64_t kBytes = kFifth ? 176 : 144;
    constexpr int kNibbles = kFifth ? 48 : 16;
    const __m256i low = _mm256_set1_epi8(0x0f), fifth = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += kBytes, x += 8) {
        uint8_t scale[8], min[8];
        scales_mins_k4(w + 4, scale, min);
        __m256i qh = kFifth ? load256(w + 16) : _mm256_setzero_si256(), isum = _mm256_setzero_si256();
        int32_t msum = 0;
        for (int j = 0; j < 8; j += 2) {
            const __m256i v = load256(w + kNibbles + 16 * j);
            __m256i u0 = _mm256_and_si256(v, low), u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if constexpr (kFifth) {
                u0 = _mm256_or_si256(u0, _mm256_and_si256(_mm256_slli_epi16(qh, 4), fifth));
                u1 = _mm256_or_si256(u1, _mm256_and_si256(_mm256_slli_epi16(qh, 3), fifth));
                qh = _mm256_srli_epi16(qh, 2);
            }
            isum = _mm256_add_epi32(isum, dot_scaled(u0, load256(x[j].qs), _mm256_set1_epi16(scale[j])));
            isum = _mm256_add_epi32(isum, dot_scaled(u1, load256(x[j + 1].qs), _mm256_set1_epi16(scale[j + 1])));
            msum += min[j] * x[j].sum + min[j + 1] * x[j + 1].sum;
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[0].d), _mm256_cvtepi32_ps(isum), acc);
        mins += half(w + 2) * x[0].d * static_cast<float>(msum);
    }
    return hsum(acc) - mins;
}

// Q6_K: in each half h, sub-block 4h + t takes the low (t < 2) or high nibbles of the
// 32 bytes at ql + 64h + 32 (t % 2), and bits 2t, 2t + 1 of the 32 bytes at qh + 32h
// as bits 4 and 5; q = u - 32, with a signed int8 scale per 16 elements.
float dot_q6_k_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i low = _mm256_set1_epi8(0x0f), high = _mm256_set1_epi8(0x30);
    float acc = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += 210, x += 8) {
        const auto *scale = reinterpret_cast<const int8_t *>(w + 192);
        __m256i isum = _mm256_setzero_si256();
        int32_t offset = 0;
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = load256(w + 64 * h), ql1 = load256(w + 64 * h + 32), qh = load256(w + 128 + 32 * h);
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high)),
                _mm256_or_si256(_mm256_and_si256(ql1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), _mm256_and_si256(qh, high)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), _mm256_and_si256(_mm256_srli_epi16(qh, 2), high)),
            };
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * h + t, lo = scale[2 * j], hi = scale[2 * j + 1];
                isum = _mm256_add_epi32(isum, dot_scaled(u[t], load256(x[j].qs), scales16(lo, hi)));
                offset += scaled_sums(x[j], lo, hi);
            }
        }
        acc += half(w + 208) * x[0].d * static_cast<float>(hsum_i32(isum) - 32 * offset);
    }
    return acc;
}

// The 16 scales of Q3_K from their 12 bytes, minus 32: scale i has its low nibble in
// byte i % 8 (the high nibble for i >= 8) and its top two bits in byte 8 + i % 4,
// at bit 2 (i / 4).
inline void scales_q3_k(const uint8_t *packed, int8_t scale[16]) {
    uint32_t s[3];
    std::memcpy(s, packed, 12);
    const __m128i v = _mm_set_epi32(static_cast<int>((s[1] >> 4 & 0x0f0f0f0f) | (s[2] >> 6 & 0x03030303) << 4),
                                    static_cast<int>((s[0] >> 4 & 0x0f0f0f0f) | (s[2] >> 4 & 0x03030303) << 4),
                                    static_cast<int>((s[1] & 0x0f0f0f0f) | (s[2] >> 2 & 0x03030303) << 4),
                                    static_cast<int>((s[0] & 0x0f0f0f0f) | (s[2] & 0x03030303) << 4));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(scale), _mm_sub_epi8(v, _mm_set1_epi8(32)));
}

// Q3_K: in each half h, sub-block 4h + t takes bits 2t, 2t + 1 of the 32 bytes at
// qs + 32h, plus 4 where bit 4h + t of the 32 bytes of hmask is set (hmask shifts right
// as the sub-blocks advance); q = u - 4.
float dot_q3_k_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i two = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    float acc = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += 110, x += 8) {
        int8_t scale[16];
        scales_q3_k(w + 96, scale);
        __m256i hmask = load256(w), isum = _mm256_setzero_si256();
        int32_t offset = 0;
        for (int h = 0; h < 2; ++h) {
            const __m256i qs = load256(w + 32 + 32 * h);
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * h + t, lo = scale[2 * j], hi = scale[2 * j + 1];
                const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), two),
                                                  _mm256_and_si256(_mm256_slli_epi16(hmask, 2), four));
                hmask = _mm256_srli_epi16(hmask, 1);
                isum = _mm256_add_epi32(isum, dot_scaled(u, load256(x[j].qs), scales16(lo, hi)));
                offset += scaled_sums(x[j], lo, hi);
            }
        }
        acc += half(w + 108) * x[0].d * static_cast<float>(hsum_i32(isum) - 4 * offset);
    }
    return acc;
}

// Q2_K: sub-block 4h + t takes bits 2t, 2t + 1 of the 32 bytes at qs + 32h; each
// 16 elements have a byte of 4-bit scale (low) and min (high).
float dot_q2_k_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i two = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += 84, x += 8) {
        __m256i isum = _mm256_setzero_si256();
        int32_t msum = 0;
        for (int h = 0; h < 2; ++h) {
            const __m256i qs = load256(w + 16 + 32 * h);
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * h + t, lo = w[2 * j], hi = w[2 * j + 1];
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), two);
                isum = _mm256_add_epi32(isum, dot_scaled(u, load256(x[j].qs), scales16(lo & 15, hi & 15)));
                msum += scaled_sums(x[j], lo >> 4, hi >> 4);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w + 80) * x[0].d), _mm256_cvtepi32_ps(isum), acc);
        mins += half(w + 82) * x[0].d * static_cast<float>(msum);
    }
    return hsum(acc) - mins;
}

// IQ4_XS: sub-block j's 16 bytes of codes into Table (kIQ4NL) at 8 + 16j, its 6-bit
// scale (minus 32) from nibble j of bytes 4..7 and bits 2j, 2j + 1 of the u16 at 2.
template <const int8_t (&Table)[16]>
float dot_iq4_xs_avx2(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const __m256i table = code_table(Table);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t s = 0; s < n / QK_K; ++s, w += 136, x += 8) {
        uint16_t high;
        std::memcpy(&high, w + 2, 2);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const int scale = ((w[4 + j / 2] >> 4 * (j % 2) & 15) | (high >> 2 * j & 3) << 4) - 32;
            const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(w + 8 + 16 * j)), xs = load256(x[j].qs);
            isum = _mm256_add_epi32(isum, dot_scaled(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xs, q), _mm256_set1_epi16(scale)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w) * x[0].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

// ---- float types -------------------------------------------------------------

float dot_f32_avx2(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    const auto *w = reinterpret_cast<const float *>(row);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
    float r = hsum(acc);
    for (; i < n; ++i) r += w[i] * x[i];
    return r;
}

float dot_f16_avx2(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * i)));
        acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
    }
    float r = hsum(acc);
    for (; i < n; ++i) r += half(row + 2 * i) * x[i];
    return r;
}

// bf16 is the top half of an f32: widen to 32 bits and shift into place.
float dot_bf16_avx2(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * i)));
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(x + i), acc);
    }
    float r = hsum(acc);
    for (; i < n; ++i) {
        uint32_t bits = 0;
        std::memcpy(reinterpret_cast<uint8_t *>(&bits) + 2, row + 2 * i, 2);
        float w;
        std::memcpy(&w, &bits, 4);
        r += w * x[i];
    }
    return r;
}

// The row dots into a variant's table.
void set_row_dots(Kernels &k) {
    k.dot[GGML_F32] = dot_f32_avx2;
    k.dot[GGML_F16] = dot_f16_avx2;
    k.dot[GGML_BF16] = dot_bf16_avx2;
    k.dot[GGML_Q4_0] = dot_q4_0_avx2;
    k.dot[GGML_Q4_1] = dot_q4_1_avx2;
    k.dot[GGML_Q5_0] = dot_q5_0_avx2;
    k.dot[GGML_Q5_1] = dot_q5_1_avx2;
    k.dot[GGML_Q8_0] = dot_q8_0_avx2;
    k.dot[GGML_IQ4_NL] = dot_iq4_nl_avx2<kIQ4NL>;
    k.dot[GGML_MXFP4] = dot_mxfp4_avx2<kFP4>;
    k.dot[GGML_Q2_K] = dot_q2_k_avx2;
    k.dot[GGML_Q3_K] = dot_q3_k_avx2;
    k.dot[GGML_Q4_K] = dot_q4_5_k_avx2<false>;
    k.dot[GGML_Q5_K] = dot_q4_5_k_avx2<true>;
    k.dot[GGML_Q6_K] = dot_q6_k_avx2;
    k.dot[GGML_IQ4_XS] = dot_iq4_xs_avx2<kIQ4NL>;
}

} // namespace
} // namespace llmd
