// simd_avx2.h — small vector math shared by the 256-bit variants' kernels.
#pragma once

#include <immintrin.h>

namespace llmd {
namespace {

// acc + the sums of u8 × s8 products in groups of four, as 8 int32 lanes. With VNNI one
// vpdpbusd, exact: the avx-vnni variant has its VEX form; an AVX-512 VL build of the same
// sources its EVEX form (the avx512 variant's rows, and native/tests/build_kernel_test.py's
// twin of avx-vnni, which runs avx-vnni's sources on AVX-512 CPUs). Without it vpmaddubsw
// then vpmaddwd, whose int16 pair sums saturate past 32767: callers keep each pair of
// products within that (rows_avx2.h's sign trick). kVnni256 says which.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kVnni256 = true;
inline __m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
constexpr bool kVnni256 = true;
inline __m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
constexpr bool kVnni256 = false;
inline __m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

// e^x for x <= 88, exp512's arithmetic (simd_avx512.h) 8 lanes at a time, to the same bits:
// 2^n * e^r with |r| <= ln2 / 2 and a degree-7 Taylor polynomial; x is clamped to
// [-87, 88], so n stays in [-126, 127] and 2^n is built exactly in the exponent field.
inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x); // ln 2, high bits
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);   // ln 2, the rest
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// tanh(y), tanh512's arithmetic (simd_avx512.h) 8 lanes at a time.
inline __m256 tanh256(__m256 y) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = exp256(_mm256_mul_ps(_mm256_andnot_ps(sign, y), _mm256_set1_ps(-2.0f)));
    const __m256 r = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), t), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
    return _mm256_or_ps(r, _mm256_and_ps(sign, y));
}

// The sum of 8 lanes, as ((0+4) + (2+6)) + ((1+5) + (3+7)).
inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

} // namespace
} // namespace llmd

