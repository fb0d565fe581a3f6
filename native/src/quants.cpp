// quants.cpp — see quants.h.
#include "quants.h"

#include "gguf.h"

#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMD_AVX2 1
#endif

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

size_t row_bytes(uint32_t type, int64_t n) {
    int64_t be = 1, bb = 0;
    ggml_type_layout(type, &be, &bb);
    return static_cast<size_t>(n / be * bb);
}

bool type_uses_q8a(uint32_t type) {
    return type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q8_0;
}

void quantize_row_q8a(const float *x, BlockQ8A *y, int64_t n) {
    for (int64_t b = 0; b < n / QK; ++b, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; ++j) {
            const int q = static_cast<int>(std::nearbyint(x[j] * id));
            y[b].qs[j] = static_cast<int8_t>(q);
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * static_cast<float>(sum);
    }
}

void dequantize_row(uint32_t type, const void *row, float *y, int64_t n) {
    switch (type) {
    case GGML_F32:
        std::memcpy(y, row, static_cast<size_t>(n) * 4);
        return;
    case GGML_F16: {
        const auto *h = static_cast<const uint16_t *>(row);
        for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
        return;
    }
    case GGML_Q4_0:
        for (int64_t b = 0; b < n / QK; ++b, y += QK) {
            const auto &blk = static_cast<const BlockQ4_0 *>(row)[b];
            const float d = fp16_to_fp32(blk.d);
            for (int j = 0; j < QK / 2; ++j) {
                y[j] = static_cast<float>((blk.qs[j] & 0x0f) - 8) * d;
                y[j + QK / 2] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
            }
        }
        return;
    case GGML_Q4_1:
        for (int64_t b = 0; b < n / QK; ++b, y += QK) {
            const auto &blk = static_cast<const BlockQ4_1 *>(row)[b];
            const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
            for (int j = 0; j < QK / 2; ++j) {
                y[j] = static_cast<float>(blk.qs[j] & 0x0f) * d + m;
                y[j + QK / 2] = static_cast<float>(blk.qs[j] >> 4) * d + m;
            }
        }
        return;
    case GGML_Q8_0:
        for (int64_t b = 0; b < n / QK; ++b, y += QK) {
            const auto &blk = static_cast<const BlockQ8_0 *>(row)[b];
            const float d = fp16_to_fp32(blk.d);
            for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(blk.qs[j]) * d;
        }
        return;
    default:
        std::memset(y, 0, static_cast<size_t>(n) * 4);
    }
}

// ---- scalar reference ---------------------------------------------------

float vec_dot_ref(uint32_t type, const void *row, const float *x, const BlockQ8A *xq, int64_t n) {
    const int64_t nb = n / QK;
    double acc = 0.0;
    switch (type) {
    case GGML_F32: {
        const auto *w = static_cast<const float *>(row);
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(w[i]) * x[i];
        break;
    }
    case GGML_F16: {
        const auto *w = static_cast<const uint16_t *>(row);
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(fp16_to_fp32(w[i])) * x[i];
        break;
    }
    case GGML_Q4_0:
        for (int64_t b = 0; b < nb; ++b) {
            const auto &w = static_cast<const BlockQ4_0 *>(row)[b];
            int sum = 0;
            for (int j = 0; j < QK / 2; ++j)
                sum += ((w.qs[j] & 0x0f) - 8) * xq[b].qs[j] + ((w.qs[j] >> 4) - 8) * xq[b].qs[j + QK / 2];
            acc += static_cast<double>(fp16_to_fp32(w.d)) * xq[b].d * sum;
        }
        break;
    case GGML_Q4_1:
        for (int64_t b = 0; b < nb; ++b) {
            const auto &w = static_cast<const BlockQ4_1 *>(row)[b];
            int sum = 0;
            for (int j = 0; j < QK / 2; ++j)
                sum += (w.qs[j] & 0x0f) * xq[b].qs[j] + (w.qs[j] >> 4) * xq[b].qs[j + QK / 2];
            acc += static_cast<double>(fp16_to_fp32(w.d)) * xq[b].d * sum +
                   static_cast<double>(fp16_to_fp32(w.m)) * xq[b].s;
        }
        break;
    case GGML_Q8_0:
        for (int64_t b = 0; b < nb; ++b) {
            const auto &w = static_cast<const BlockQ8_0 *>(row)[b];
            int sum = 0;
            for (int j = 0; j < QK; ++j) sum += w.qs[j] * xq[b].qs[j];
            acc += static_cast<double>(fp16_to_fp32(w.d)) * xq[b].d * sum;
        }
        break;
    default:
        break;
    }
    return static_cast<float>(acc);
}

// ---- AVX2 / AVX-512 VNNI -----------------------------------------------

#ifdef LLMD_AVX2
namespace {

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

inline float half(uint16_t h) { return _cvtsh_ss(h); }

float dot_q4_0(const BlockQ4_0 *w, const BlockQ8A *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i q4 = _mm256_sub_epi8(unpack_nibbles(w[b].qs), _mm256_set1_epi8(8));
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[b].qs));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q4, q8));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w[b].d) * x[b].d), p, acc);
    }
    return hsum(acc);
}

float dot_q4_1(const BlockQ4_1 *w, const BlockQ8A *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float offset = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i q4 = unpack_nibbles(w[b].qs);
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[b].qs));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(q4, q8));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w[b].d) * x[b].d), p, acc);
        offset += half(w[b].m) * x[b].s;
    }
    return hsum(acc) + offset;
}

float dot_q8_0(const BlockQ8_0 *w, const BlockQ8A *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w[b].qs));
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[b].qs));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(qw, q8));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w[b].d) * x[b].d), p, acc);
    }
    return hsum(acc);
}

float dot_f32(const float *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
    float r = hsum(acc);
    for (; i < n; ++i) r += w[i] * x[i];
    return r;
}

float dot_f16(const uint16_t *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + i)));
        acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
    }
    float r = hsum(acc);
    for (; i < n; ++i) r += half(w[i]) * x[i];
    return r;
}

} // namespace

float vec_dot(uint32_t type, const void *row, const float *x, const BlockQ8A *xq, int64_t n) {
    switch (type) {
    case GGML_F32: return dot_f32(static_cast<const float *>(row), x, n);
    case GGML_F16: return dot_f16(static_cast<const uint16_t *>(row), x, n);
    case GGML_Q4_0: return dot_q4_0(static_cast<const BlockQ4_0 *>(row), xq, n / QK);
    case GGML_Q4_1: return dot_q4_1(static_cast<const BlockQ4_1 *>(row), xq, n / QK);
    case GGML_Q8_0: return dot_q8_0(static_cast<const BlockQ8_0 *>(row), xq, n / QK);
    default: return 0.0f;
    }
}

const char *kernel_path() {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#else
    return "avx2";
#endif
}

#else // portable build: the reference is the fast path

float vec_dot(uint32_t type, const void *row, const float *x, const BlockQ8A *xq, int64_t n) {
    return vec_dot_ref(type, row, x, xq, n);
}

const char *kernel_path() { return "scalar"; }

#endif

} // namespace llmd
