// simd_avx512.h — small vector math shared by the avx512 variant's kernels.
#pragma once

#include <immintrin.h>

namespace llmd {
namespace {

// e^x for x <= 88: 2^n * e^r with |r| <= ln2 / 2 and a degree-7 Taylor polynomial
// (relative error below 1e-7); 0 below -87.
inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x); // ln 2, high bits
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);   // ln 2, the rest
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    return _mm512_scalef_ps(p, n);
}

// tanh(y) = (1 - e^-2|y|) / (1 + e^-2|y|) with y's sign: ±1 where e^-2|y| underflows
// (exp512 stops at e^-87), and within about 1e-7 of the exact value near 0.
inline __m512 tanh512(__m512 y) {
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i bits = _mm512_castps_si512(y);
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, bits));
    const __m512 t = exp512(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
    const __m512 r = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), t), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(sign, bits)));
}

} // namespace
} // namespace llmd
