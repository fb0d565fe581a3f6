// quants_avx2.h — the fast row dot products of AVX2 builds (with VNNI where the
// CPU has it), for the traits table in quants.cpp. Each is checked against its
// type's scalar reference by tests/test_kernels.py.
//
// Q4_0, Q4_1 and Q8_0 unpack their blocks in vector registers; the other integer
// types decode each 32-element piece by its definition (quants.cpp) and multiply
// in vectors. Every row sums its pieces in one fixed order, so a token's result
// does not depend on the batch it is in.
#pragma once

#include "quants.h"

#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LLMD_AVX2 1
#endif

namespace llmd {
namespace {

#ifdef LLMD_AVX2

// Sum of u8 × s8 products in groups of four, as 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

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

// Any integer type through its piece decoder: the int8 products of each half-piece
// (sign trick, pairs summed in int16, at most 2 × 128 × 127) times the half's
// integer scale, in int32; then d × x.d in float, and the mins against x's sums.
template <DecodeFn Decode> float dot_pieces_avx2(const uint8_t *row, const float *, const BlockQ8A *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    Piece p;
    for (int64_t k = 0; k < n / QK; ++k) {
        Decode(row, k, &p);
        const __m256i q = load256(p.q), xs = load256(x[k].qs);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xs, q));
        const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(p.scale[1])),
                                                _mm_set1_epi16(static_cast<int16_t>(p.scale[0])));
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, scales));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(p.d * x[k].d), sum, acc);
        mins += x[k].d * (p.min(0) * static_cast<float>(x[k].sum_lo) + p.min(1) * static_cast<float>(x[k].sum - x[k].sum_lo));
    }
    return hsum(acc) + mins;
}

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

template <DecodeFn Decode> constexpr DotFn fast_dot_pieces = dot_pieces_avx2<Decode>;
constexpr DotFn fast_dot_q4_0 = dot_q4_0_avx2, fast_dot_q4_1 = dot_q4_1_avx2, fast_dot_q8_0 = dot_q8_0_avx2;
constexpr DotFn fast_dot_f32 = dot_f32_avx2, fast_dot_f16 = dot_f16_avx2, fast_dot_bf16 = dot_bf16_avx2;

#else // portable build: the traits table uses the references

template <DecodeFn> constexpr DotFn fast_dot_pieces = nullptr;
constexpr DotFn fast_dot_q4_0 = nullptr, fast_dot_q4_1 = nullptr, fast_dot_q8_0 = nullptr;
constexpr DotFn fast_dot_f32 = nullptr, fast_dot_f16 = nullptr, fast_dot_bf16 = nullptr;

#endif

} // namespace
} // namespace llmd
