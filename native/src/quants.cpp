// quants.cpp — see quants.h. The definition of every tensor type (how a block
// decodes), the scalar references built from it, activation quantization and the
// traits table. The fast kernels are in quants_avx2.h and quants_packed.h.
#include "quants.h"

#include "quants_avx2.h"
#include "quants_packed.h"
#include "quantize.h"
#include "simd_avx2.h"

#include <cmath>
#include <cstring>

namespace llmd {

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (mant << 13); // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { // subnormal: renormalize
        int e = -1;
        do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
        bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0); // inf / nan
    if (ax >= 0x477ff000) return sign | 0x7c00; // rounds past the largest half: inf
    if (ax < 0x38800000) { // half subnormal or zero: scale by 2^24 and round to even
        const float v = std::nearbyint(std::fabs(f) * 16777216.0f);
        return sign | static_cast<uint16_t>(v);
    }
    // normal: rebias exponent, round mantissa to nearest even
    uint32_t m = ax + 0xc8000000u; // exponent - 112
    m += 0xfff + ((m >> 13) & 1);
    return sign | static_cast<uint16_t>(m >> 13);
}

namespace {

template <typename T> T load(const uint8_t *p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
float half_at(const uint8_t *p) { return fp16_to_fp32(load<uint16_t>(p)); }

// 4-bit codes of IQ4_NL and IQ4_XS, and of MXFP4 (e2m1 values doubled; the scale
// is halved to match).
constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// A piece with one scale and one min (m * mscale) for all 32 elements.
void uniform(Piece *o, float d, int32_t scale, float m = 0.0f, int32_t mscale = 0) {
    o->d = d;
    o->scale[0] = o->scale[1] = scale;
    o->m = m;
    o->mscale[0] = o->mscale[1] = mscale;
}

// 16 bytes of nibbles: element j is the low nibble of byte j, element 16 + j its high one.
void nibbles(const uint8_t *qs, int8_t bias, Piece *o) {
    for (int j = 0; j < 16; ++j) {
        o->q[j] = static_cast<int8_t>((qs[j] & 15) + bias);
        o->q[j + 16] = static_cast<int8_t>((qs[j] >> 4) + bias);
    }
}
void nibble_codes(const uint8_t *qs, const int8_t *table, Piece *o) {
    for (int j = 0; j < 16; ++j) {
        o->q[j] = table[qs[j] & 15];
        o->q[j + 16] = table[qs[j] >> 4];
    }
}
// Nibbles plus a fifth bit per element from the 32-bit word qh (bit i for element i).
void nibbles_qh(const uint8_t *qs, uint32_t qh, int8_t bias, Piece *o) {
    for (int j = 0; j < 16; ++j) {
        o->q[j] = static_cast<int8_t>(((qs[j] & 15) | ((qh >> j) & 1) << 4) + bias);
        o->q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + bias);
    }
}

// ---- blocks of 32 --------------------------------------------------------

// Q4_0 (18 bytes): f16 d, 16 nibble bytes. x = d * (q - 8).
void decode_q4_0(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 18;
    uniform(o, half_at(b), 1);
    nibbles(b + 2, -8, o);
}
// Q4_1 (20): f16 d, f16 m, 16 nibble bytes. x = d * q + m.
void decode_q4_1(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 20;
    uniform(o, half_at(b), 1, half_at(b + 2), 1);
    nibbles(b + 4, 0, o);
}
// Q5_0 (22): f16 d, u32 fifth bits, 16 nibble bytes. x = d * (q - 16).
void decode_q5_0(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 22;
    uniform(o, half_at(b), 1);
    nibbles_qh(b + 6, load<uint32_t>(b + 2), -16, o);
}
// Q5_1 (24): f16 d, f16 m, u32 fifth bits, 16 nibble bytes. x = d * q + m.
void decode_q5_1(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 24;
    uniform(o, half_at(b), 1, half_at(b + 2), 1);
    nibbles_qh(b + 8, load<uint32_t>(b + 4), 0, o);
}
// Q8_0 (34): f16 d, 32 int8. x = d * q.
void decode_q8_0(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 34;
    uniform(o, half_at(b), 1);
    std::memcpy(o->q, b + 2, QK);
}
// IQ4_NL (18): f16 d, 16 bytes of 4-bit codes into kIQ4NL. x = d * kIQ4NL[code].
void decode_iq4_nl(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 18;
    uniform(o, half_at(b), 1);
    nibble_codes(b + 2, kIQ4NL, o);
}
// MXFP4 (17): e8m0 exponent e, 16 bytes of e2m1 codes. x = 2^(e - 127) * e2m1 value,
// that is 2^(e - 128) * kFP4[code].
void decode_mxfp4(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k * 17;
    uniform(o, std::ldexp(1.0f, static_cast<int>(b[0]) - 128), 1);
    nibble_codes(b + 1, kFP4, o);
}

// ---- K-quant super-blocks of 256 -------------------------------------------

// The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K
// and Q5_K: bytes 0..3 hold scales 0..3 (and the top bits of scales 4..7), bytes
// 4..7 mins 0..3 (and the top bits of mins 4..7), bytes 8..11 the low nibbles of
// scales and mins 4..7.
void scale_min_k4(const uint8_t *s, int j, int *scale, int *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// Q4_K (144): f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles.
// Sub-block j of 32: x = d * scale_j * q - dmin * min_j, q the low (j even) or high
// (j odd) nibbles of bytes 32 (j / 2) .. + 31.
void decode_q4_k(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 144;
    const int j = static_cast<int>(k % 8);
    int scale, min;
    scale_min_k4(b + 4, j, &scale, &min);
    uniform(o, half_at(b), scale, -half_at(b + 2), min);
    const uint8_t *qs = b + 16 + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) o->q[l] = static_cast<int8_t>((qs[l] >> 4 * (j % 2)) & 15);
}
// Q5_K (176): as Q4_K with 32 bytes of fifth bits before the nibbles: bit j of byte l
// is the fifth bit of element l of sub-block j.
void decode_q5_k(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 176;
    const int j = static_cast<int>(k % 8);
    int scale, min;
    scale_min_k4(b + 4, j, &scale, &min);
    uniform(o, half_at(b), scale, -half_at(b + 2), min);
    const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (j / 2);
    for (int l = 0; l < 32; ++l)
        o->q[l] = static_cast<int8_t>(((qs[l] >> 4 * (j % 2)) & 15) | ((qh[l] >> j) & 1) << 4);
}
// Q6_K (210): 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 scales,
// f16 d. Element e = 128 h + 32 t + l: low nibble of ql[64 h + 32 (t % 2) + l],
// shifted by 4 (t / 2); high bits (qh[32 h + l] >> 2 t) & 3; x = d * scale[e / 16] * (q - 32).
void decode_q6_k(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 210;
    const int j = static_cast<int>(k % 8), h = j / 4, t = j % 4;
    const auto *scales = reinterpret_cast<const int8_t *>(b + 192);
    o->d = half_at(b + 208);
    o->scale[0] = scales[2 * j];
    o->scale[1] = scales[2 * j + 1];
    o->m = 0.0f;
    o->mscale[0] = o->mscale[1] = 0;
    const uint8_t *ql = b + 64 * h + 32 * (t % 2), *qh = b + 128 + 32 * h;
    for (int l = 0; l < 32; ++l)
        o->q[l] = static_cast<int8_t>((((ql[l] >> 4 * (t / 2)) & 15) | ((qh[l] >> 2 * t) & 3) << 4) - 32);
}
// Q3_K (110): 32 bytes of high bits, 64 bytes of bit pairs, 12 bytes of 6-bit scales,
// f16 d. Element e = 128 h + 32 t + l: low bits (qs[32 h + l] >> 2 t) & 3, minus 4
// unless bit 4 h + t of hmask[l] is set; x = d * (scale[e / 16] - 32) * q. Scale i
// has its low nibble in byte i % 8 (shifted by 4 (i / 8)) and its top two bits in
// byte 8 + i % 4 (shifted by 2 (i / 4)).
void decode_q3_k(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 110;
    const int j = static_cast<int>(k % 8), h = j / 4, t = j % 4;
    const uint8_t *hmask = b, *qs = b + 32 + 32 * h, *sc = b + 96;
    o->d = half_at(b + 108);
    o->m = 0.0f;
    for (int s = 0; s < 2; ++s) {
        const int i = 2 * j + s;
        o->scale[s] = (((sc[i % 8] >> 4 * (i / 8)) & 15) | ((sc[8 + i % 4] >> 2 * (i / 4)) & 3) << 4) - 32;
        o->mscale[s] = 0;
    }
    for (int l = 0; l < 32; ++l)
        o->q[l] = static_cast<int8_t>(((qs[l] >> 2 * t) & 3) - ((hmask[l] >> (4 * h + t)) & 1 ? 0 : 4));
}
// Q2_K (84): 16 bytes of 4-bit scale and min pairs, 64 bytes of bit pairs, f16 d,
// f16 dmin. Element e = 128 h + 32 t + l: q = (qs[32 h + l] >> 2 t) & 3;
// x = d * (sc[e / 16] & 15) * q - dmin * (sc[e / 16] >> 4).
void decode_q2_k(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 84;
    const int j = static_cast<int>(k % 8), h = j / 4, t = j % 4;
    o->d = half_at(b + 80);
    o->m = -half_at(b + 82);
    for (int s = 0; s < 2; ++s) {
        o->scale[s] = b[2 * j + s] & 15;
        o->mscale[s] = b[2 * j + s] >> 4;
    }
    const uint8_t *qs = b + 16 + 32 * h;
    for (int l = 0; l < 32; ++l) o->q[l] = static_cast<int8_t>((qs[l] >> 2 * t) & 3);
}
// IQ4_XS (136): f16 d, u16 high scale bits, 4 bytes of low scale nibbles, 128 bytes
// of codes into kIQ4NL. Sub-block j: scale = (low nibble j | 2 high bits j) - 32,
// codes as IQ4_NL's in bytes 16 j .. 16 j + 15.
void decode_iq4_xs(const uint8_t *row, int64_t k, Piece *o) {
    const uint8_t *b = row + k / 8 * 136;
    const int j = static_cast<int>(k % 8);
    const int scale = (((b[4 + j / 2] >> 4 * (j % 2)) & 15) | ((load<uint16_t>(b + 2) >> 2 * j) & 3) << 4) - 32;
    uniform(o, half_at(b), scale);
    nibble_codes(b + 8 + 16 * j, kIQ4NL, o);
}

// ---- references derived from the definitions --------------------------------

template <DecodeFn Decode> void to_float_pieces(const uint8_t *row, float *y, int64_t n) {
    Piece p;
    for (int64_t k = 0; k < n / QK; ++k, y += QK) {
        Decode(row, k, &p);
        for (int i = 0; i < QK; ++i) y[i] = p.d * static_cast<float>(p.scale[i / 16]) * p.q[i] + p.min(i / 16);
    }
}

// Integer sums per half-piece, scaled and summed in double: exact up to the final
// rounding but for the products d * scale * x.d.
template <DecodeFn Decode> float dot_ref_pieces(const uint8_t *row, const float *, const BlockQ8A *xq, int64_t n) {
    double acc = 0.0;
    Piece p;
    for (int64_t k = 0; k < n / QK; ++k) {
        Decode(row, k, &p);
        const BlockQ8A &x = xq[k];
        int64_t dot[2] = {0, 0};
        for (int i = 0; i < QK; ++i) dot[i / 16] += p.q[i] * x.qs[i];
        const double xd = x.d;
        acc += static_cast<double>(p.d) * xd * (static_cast<double>(p.scale[0]) * dot[0] + static_cast<double>(p.scale[1]) * dot[1]);
        acc += xd * (static_cast<double>(p.min(0)) * x.sum_lo + static_cast<double>(p.min(1)) * (x.sum - x.sum_lo));
    }
    return static_cast<float>(acc);
}

float bf16_to_fp32(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

void to_float_f32(const uint8_t *row, float *y, int64_t n) { std::memcpy(y, row, static_cast<size_t>(n) * 4); }
void to_float_f16(const uint8_t *row, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(load<uint16_t>(row + 2 * i));
}
void to_float_bf16(const uint8_t *row, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(load<uint16_t>(row + 2 * i));
}

template <ToFloatFn ToFloat, int kBytes> float dot_ref_float(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    double acc = 0.0;
    float w;
    for (int64_t i = 0; i < n; ++i) {
        ToFloat(row + kBytes * i, &w, 1);
        acc += static_cast<double>(w) * x[i];
    }
    return static_cast<float>(acc);
}

// One block of 32 with a given scale d (and its inverse id).
void quantize_block_ref(const float *x, float d, float id, BlockQ8A *y) {
    y->sum = y->sum_lo = 0;
    for (int j = 0; j < QK; ++j) {
        const int q = static_cast<int>(std::nearbyint(x[j] * id));
        y->qs[j] = static_cast<int8_t>(q);
        y->sum += q;
        if (j < 16) y->sum_lo += q;
    }
    y->d = d;
    y->s = d * static_cast<float>(y->sum);
}

void quantize_block(const float *x, float d, float id, BlockQ8A *y) {
#if defined(__AVX512F__)
    // The scalar arithmetic 16 lanes at a time: the conversion rounds to nearest
    // even like nearbyint, so the blocks are bit for bit the same.
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(y->qs), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(y->qs + 16), _mm512_cvtsepi32_epi8(qhi));
    y->sum_lo = _mm512_reduce_add_epi32(qlo);
    y->sum = y->sum_lo + _mm512_reduce_add_epi32(qhi);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    // The scalar arithmetic 8 lanes at a time (the conversion rounds to nearest even
    // like nearbyint); the packs saturate as the AVX-512 path's conversion does, and
    // interleave 128-bit lanes, which the permutation puts back in order.
    __m256i q[4];
    for (int h = 0; h < 4; ++h) q[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * h), _mm256_set1_ps(id)));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(y->qs),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    y->sum_lo = hsum256_epi32(_mm256_add_epi32(q[0], q[1]));
    y->sum = y->sum_lo + hsum256_epi32(_mm256_add_epi32(q[2], q[3]));
#else
    quantize_block_ref(x, d, id, y);
    return;
#endif
    y->d = d;
    y->s = d * static_cast<float>(y->sum);
}

float max_abs_ref(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    return amax;
}

float max_abs(const float *x, int64_t n) {
    float amax = 0.0f;
#if defined(__AVX512F__)
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    amax = _mm512_reduce_max_ps(m); // max is exact in any order
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
    amax = hmax256(m); // max is exact in any order
#else
    amax = max_abs_ref(x, n);
#endif
    return amax;
}

// n floats (n a multiple of group) into n / QK blocks, one scale d = max |x| / 127
// per group of `group` elements; Fast picks the vector kernels or the scalar ones.
template <bool Fast> void quantize_row(const float *x, BlockQ8A *y, int64_t n, int64_t group) {
    for (int64_t g = 0; g < n; g += group) {
        const float d = (Fast ? max_abs : max_abs_ref)(x + g, group) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = g / QK; b < (g + group) / QK; ++b)
            (Fast ? quantize_block : quantize_block_ref)(x + b * QK, d, id, y + b);
    }
}

// ---- the traits table ---------------------------------------------------------

// Panel layouts: {bits, offset, split, mins, f16, lut, k_scales}.
constexpr PanelLayout kPanelQ4_0{4, 8, false, false, true, nullptr, false};
constexpr PanelLayout kPanelQ4_1{4, 0, false, true, true, nullptr, false};
constexpr PanelLayout kPanelQ5_0{5, 16, false, false, true, nullptr, false};
constexpr PanelLayout kPanelQ5_1{5, 0, false, true, true, nullptr, false};
constexpr PanelLayout kPanelQ8_0{8, 128, false, false, true, nullptr, false};
constexpr PanelLayout kPanelIQ4NL{4, 128, false, false, true, kIQ4NL, false};
constexpr PanelLayout kPanelMXFP4{4, 128, false, false, false, kFP4, false};
constexpr PanelLayout kPanelQ2_K{2, 0, true, true, true, nullptr, true};
constexpr PanelLayout kPanelQ3_K{3, 4, true, false, true, nullptr, true};
constexpr PanelLayout kPanelQ4_K{4, 0, false, true, true, nullptr, true};
constexpr PanelLayout kPanelQ5_K{5, 0, false, true, true, nullptr, true};
constexpr PanelLayout kPanelQ6_K{6, 32, true, false, true, nullptr, true};
constexpr PanelLayout kPanelIQ4XS{4, 128, false, false, true, kIQ4NL, true};

// A type the engine computes with, dotted against BlockQ8A.
template <DecodeFn Decode, const PanelLayout &Panel, DotFn Fast>
constexpr TypeTraits quantized(const char *name, int64_t elems, int64_t bytes, FromFloatFn from_float = nullptr) {
    // Super-block types take activations quantized like llama.cpp's Q8_K for them.
    return {name, elems, bytes, elems == QK_K ? Activation::Q8K : Activation::Q8A, Decode, to_float_pieces<Decode>, dot_ref_pieces<Decode>,
            Fast != nullptr ? Fast : dot_ref_pieces<Decode>, Panel, panel_kernel<Panel>(), from_float};
}
// A float type, dotted against the float activations.
template <ToFloatFn ToFloat, int kBytes, DotFn Fast>
constexpr TypeTraits floating(const char *name, FromFloatFn from_float) {
    return {name, 1, kBytes, Activation::F32, nullptr, ToFloat, dot_ref_float<ToFloat, kBytes>,
            Fast != nullptr ? Fast : dot_ref_float<ToFloat, kBytes>, {}, nullptr, from_float};
}
// A type GGUF defines that the engine has no kernels for: the reader can size it,
// binding refuses it by name.
constexpr TypeTraits sized(const char *name, int64_t elems, int64_t bytes) {
    return {name, elems, bytes, Activation::None, nullptr, nullptr, nullptr, nullptr, {}, nullptr};
}

constexpr uint32_t kTypeCount = 43;

// Indexed by GGUF type number; rows with a null name are numbers GGUF retired.
const TypeTraits kTraits[kTypeCount] = {
    /*  0 */ floating<to_float_f32, 4, fast_dot_f32>("F32", quantize_row_f32),
    /*  1 */ floating<to_float_f16, 2, fast_dot_f16>("F16", quantize_row_f16),
    /*  2 */ quantized<decode_q4_0, kPanelQ4_0, fast_dot_q4_0>("Q4_0", 32, 18, quantize_row_q4_0),
    /*  3 */ quantized<decode_q4_1, kPanelQ4_1, fast_dot_q4_1>("Q4_1", 32, 20, quantize_row_q4_1),
    /*  4 */ {},
    /*  5 */ {},
    /*  6 */ quantized<decode_q5_0, kPanelQ5_0, fast_dot_q5_0>("Q5_0", 32, 22, quantize_row_q5_0),
    /*  7 */ quantized<decode_q5_1, kPanelQ5_1, fast_dot_q5_1>("Q5_1", 32, 24, quantize_row_q5_1),
    /*  8 */ quantized<decode_q8_0, kPanelQ8_0, fast_dot_q8_0>("Q8_0", 32, 34, quantize_row_q8_0),
    /*  9 */ sized("Q8_1", 32, 36),
    /* 10 */ quantized<decode_q2_k, kPanelQ2_K, fast_dot_q2_k>("Q2_K", 256, 84),
    /* 11 */ quantized<decode_q3_k, kPanelQ3_K, fast_dot_q3_k>("Q3_K", 256, 110),
    /* 12 */ quantized<decode_q4_k, kPanelQ4_K, fast_dot_q4_k>("Q4_K", 256, 144, quantize_row_q4_k),
    /* 13 */ quantized<decode_q5_k, kPanelQ5_K, fast_dot_q5_k>("Q5_K", 256, 176, quantize_row_q5_k),
    /* 14 */ quantized<decode_q6_k, kPanelQ6_K, fast_dot_q6_k>("Q6_K", 256, 210, quantize_row_q6_k),
    /* 15 */ sized("Q8_K", 256, 292),
    /* 16 */ sized("IQ2_XXS", 256, 66),
    /* 17 */ sized("IQ2_XS", 256, 74),
    /* 18 */ sized("IQ3_XXS", 256, 98),
    /* 19 */ sized("IQ1_S", 256, 50),
    /* 20 */ quantized<decode_iq4_nl, kPanelIQ4NL, fast_dot_iq4_nl<kIQ4NL>>("IQ4_NL", 32, 18),
    /* 21 */ sized("IQ3_S", 256, 110),
    /* 22 */ sized("IQ2_S", 256, 82),
    /* 23 */ quantized<decode_iq4_xs, kPanelIQ4XS, fast_dot_iq4_xs<kIQ4NL>>("IQ4_XS", 256, 136),
    /* 24 */ sized("I8", 1, 1),
    /* 25 */ sized("I16", 1, 2),
    /* 26 */ sized("I32", 1, 4),
    /* 27 */ sized("I64", 1, 8),
    /* 28 */ sized("F64", 1, 8),
    /* 29 */ sized("IQ1_M", 256, 56),
    /* 30 */ floating<to_float_bf16, 2, fast_dot_bf16>("BF16", quantize_row_bf16),
    /* 31 */ {},
    /* 32 */ {},
    /* 33 */ {},
    /* 34 */ sized("TQ1_0", 256, 54),
    /* 35 */ sized("TQ2_0", 256, 66),
    /* 36 */ {},
    /* 37 */ {},
    /* 38 */ {},
    /* 39 */ quantized<decode_mxfp4, kPanelMXFP4, fast_dot_mxfp4<kFP4>>("MXFP4", 32, 17),
    /* 40 */ sized("NVFP4", 64, 36),
    /* 41 */ sized("Q1_0", 128, 18),
    /* 42 */ sized("Q2_0", 64, 18),
};

} // namespace

const TypeTraits *type_traits(uint32_t type) {
    return type < kTypeCount && kTraits[type].name != nullptr ? &kTraits[type] : nullptr;
}

const char *type_name(uint32_t type) {
    const TypeTraits *t = type_traits(type);
    return t != nullptr ? t->name : nullptr;
}

bool type_runs(uint32_t type, int64_t cols) {
    const TypeTraits *t = type_traits(type);
    return t != nullptr && t->activation != Activation::None && cols > 0 && cols % t->block_elems == 0 &&
           (t->activation == Activation::F32 || cols % QK == 0);
}

size_t row_bytes(uint32_t type, int64_t n) {
    const TypeTraits &t = *type_traits(type);
    return static_cast<size_t>(n / t.block_elems * t.block_bytes);
}

void quantize_rows(const float *x, int n, int64_t cols, BlockQ8A *xq) {
    quantize_rows_part(x, n, cols, xq, 0, n, true, true);
}

void quantize_rows_part(const float *x, int n, int64_t cols, BlockQ8A *xq, int t0, int t1, bool q8a, bool q8k) {
    const int64_t nb = cols / QK;
    if (q8a)
        for (int t = t0; t < t1; ++t) quantize_row<true>(x + t * cols, xq + t * nb, cols, QK);
    if (q8k && cols % QK_K == 0)
        for (int t = t0; t < t1; ++t) quantize_row<true>(x + t * cols, xq + (n + t) * nb, cols, QK_K);
}

void quantize_activations(const float *x, BlockQ8A *y, int64_t n, int64_t group, bool fast) {
    (fast ? quantize_row<true> : quantize_row<false>)(x, y, n, group);
}

const char *kernel_path() {
#if defined(LLMD_PACKED)
    return "avx512-vnni, repacked";
#elif defined(LLMD_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#elif defined(LLMD_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

} // namespace llmd
