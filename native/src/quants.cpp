// quants.cpp — see quants.h.
#include "quants.h"

#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMD_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define LLMD_PACKED 1
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

namespace {

// n floats (n a multiple of QK) into n / QK blocks.
void quantize_row_q8a(const float *x, BlockQ8A *y, int64_t n) {
#if defined(__AVX512F__)
    // The same arithmetic 16 lanes at a time: max |x| is exact, and the conversion
    // rounds to nearest even like nearbyint, so the blocks are bit for bit the same.
    for (int64_t b = 0; b < n / QK; ++b, x += QK) {
        const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float d = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(y[b].qs), _mm512_cvtsepi32_epi8(qlo));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(y[b].qs + 16), _mm512_cvtsepi32_epi8(qhi));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
        y[b].d = d;
        y[b].sum = sum;
        y[b].s = d * static_cast<float>(sum);
    }
#else
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
        y[b].sum = sum;
        y[b].s = d * static_cast<float>(sum);
    }
#endif
}

} // namespace

void quantize_rows(const float *x, int n, int64_t cols, BlockQ8A *xq) {
    for (int t = 0; t < n; ++t) quantize_row_q8a(x + t * cols, xq + t * (cols / QK), cols);
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
#if defined(LLMD_PACKED)
    return "avx512-vnni, repacked";
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
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

// ---- repacked weights ----------------------------------------------------

namespace llmd {

namespace {

// One panel-block's weights: 16 rows of 32 elements, 4 or 8 bits each.
constexpr size_t weight_bytes_of(uint32_t type) { return type == GGML_Q8_0 ? kPanel * QK : kPanel * QK / 2; }

// A panel-block: its weights, then its 16 d, then (Q4_1) its 16 m.
constexpr size_t block_bytes_of(uint32_t type) {
    return weight_bytes_of(type) + (type == GGML_Q4_1 ? 2 : 1) * kPanel * sizeof(uint16_t);
}

size_t panel_bytes_of(uint32_t type, int64_t nb) { return static_cast<size_t>(nb) * block_bytes_of(type); }

} // namespace

size_t packed_bytes(uint32_t type, int64_t rows, int64_t cols) {
#ifdef LLMD_PACKED
    if (!type_uses_q8a(type) || rows < 1 || cols < QK || cols % QK != 0) return 0;
    return static_cast<size_t>((rows + kPanel - 1) / kPanel) * panel_bytes_of(type, cols / QK);
#else
    (void)type, (void)rows, (void)cols;
    return 0;
#endif
}

void pack_rows(uint32_t type, const void *w, int64_t rows, int64_t cols, uint8_t *out) {
    const int64_t nb = cols / QK, panels = (rows + kPanel - 1) / kPanel;
    const size_t wbytes = weight_bytes_of(type), bbytes = block_bytes_of(type), pbytes = panel_bytes_of(type, nb);
    const size_t src_row = row_bytes(type, cols);
    std::memset(out, 0, static_cast<size_t>(panels) * pbytes);
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + static_cast<size_t>(r) * src_row;
        uint8_t *panel = out + static_cast<size_t>(r / kPanel) * pbytes;
        const int64_t i = r % kPanel;
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = panel + b * bbytes;
            auto *d = reinterpret_cast<uint16_t *>(blk + wbytes); // (16)
            uint16_t *m = d + kPanel;                              // (16), Q4_1 only
            if (type == GGML_Q8_0) {
                const auto &src = reinterpret_cast<const BlockQ8_0 *>(row)[b];
                for (int j = 0; j < 8; ++j)
                    for (int k = 0; k < 4; ++k) blk[j * 64 + i * 4 + k] = static_cast<uint8_t>(src.qs[4 * j + k]) ^ 0x80;
                d[i] = src.d;
                continue;
            }
            const uint8_t *qs;
            if (type == GGML_Q4_0) {
                const auto &src = reinterpret_cast<const BlockQ4_0 *>(row)[b];
                qs = src.qs, d[i] = src.d;
            } else {
                const auto &src = reinterpret_cast<const BlockQ4_1 *>(row)[b];
                qs = src.qs, d[i] = src.d, m[i] = src.m;
            }
            for (int j = 0; j < 4; ++j)
                for (int k = 0; k < 4; ++k) blk[j * 64 + i * 4 + k] = qs[4 * j + k];
        }
    }
}

#ifdef LLMD_PACKED
namespace {

// T tokens against one panel: the 16 rows' dot products for each token. Weight =
// (u - 8) * d (Q4_0), (u - 128) * d (Q8_0, u = q + 128) or u * d + m (Q4_1); the
// offsets of the first two are taken off in integers, exactly: sum(u x) - k sum(x).
template <int T, uint32_t Type>
void panel_tile(const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, float *const *y, int valid,
                bool add) {
    constexpr bool kQ4 = Type != GGML_Q8_0;
    constexpr size_t kW = weight_bytes_of(Type), kB = block_bytes_of(Type);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = panel + b * kB;
        const auto *dm = reinterpret_cast<const __m256i *>(blk + kW); // d, then m
        __m512i w[8]; // w[g]: rows × elements 4g..4g+3
        if (kQ4) {
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_loadu_si512(blk + 64 * j);
                w[j] = _mm512_and_si512(v, low);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
        } else {
            for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(blk + 64 * j);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(dm));
        for (int t = 0; t < T; ++t) {
            const BlockQ8A &xb = x[t][b];
            constexpr int32_t kOffset = Type == GGML_Q4_0 ? 8 : Type == GGML_Q8_0 ? 128 : 0;
            // Two independent chains: a dpbusd's latency exceeds its issue interval.
            __m512i even = _mm512_set1_epi32(-kOffset * xb.sum), odd = _mm512_setzero_si512();
            for (int g = 0; g < 8; g += 2) {
                int32_t a, c;
                std::memcpy(&a, xb.qs + 4 * g, 4);
                std::memcpy(&c, xb.qs + 4 * g + 4, 4);
                even = _mm512_dpbusd_epi32(even, w[g], _mm512_set1_epi32(a));
                odd = _mm512_dpbusd_epi32(odd, w[g + 1], _mm512_set1_epi32(c));
            }
            const __m512i sum = _mm512_add_epi32(even, odd);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(sum), acc[t]);
            if (Type == GGML_Q4_1)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(dm + 1)), _mm512_set1_ps(xb.s), acc[t]);
        }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    for (int t = 0; t < T; ++t) {
        __m512 out = acc[t];
        if (add) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, y[t]));
        _mm512_mask_storeu_ps(y[t], mask, out);
    }
}

template <uint32_t Type>
void panel_tokens(const uint8_t *panel, int64_t nb, const BlockQ8A *xq, int n, float *y, int64_t y_stride,
                  int valid, bool add) {
    constexpr int kTile = 4; // tokens sharing one unpacking of the panel's weights
    const BlockQ8A *x[kTile];
    float *out[kTile];
    for (int t0 = 0; t0 < n; t0 += kTile) {
        const int tn = std::min(kTile, n - t0);
        for (int t = 0; t < tn; ++t) {
            x[t] = xq + static_cast<int64_t>(t0 + t) * nb;
            out[t] = y + static_cast<int64_t>(t0 + t) * y_stride;
        }
        switch (tn) {
        case 4: panel_tile<4, Type>(panel, nb, x, out, valid, add); break;
        case 3: panel_tile<3, Type>(panel, nb, x, out, valid, add); break;
        case 2: panel_tile<2, Type>(panel, nb, x, out, valid, add); break;
        default: panel_tile<1, Type>(panel, nb, x, out, valid, add); break;
        }
    }
}

} // namespace
#endif

void matmul_packed(uint32_t type, const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0,
                   int64_t p1, const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add) {
#ifdef LLMD_PACKED
    const int64_t nb = cols / QK;
    const size_t pbytes = panel_bytes_of(type, nb);
    for (int64_t p = p0; p < p1; ++p) {
        const uint8_t *panel = packed + static_cast<size_t>(p) * pbytes;
        const int valid = static_cast<int>(std::min<int64_t>(kPanel, rows - p * kPanel));
        float *out = y + p * kPanel;
        switch (type) {
        case GGML_Q4_0: panel_tokens<GGML_Q4_0>(panel, nb, xq, n, out, y_stride, valid, add); break;
        case GGML_Q4_1: panel_tokens<GGML_Q4_1>(panel, nb, xq, n, out, y_stride, valid, add); break;
        default: panel_tokens<GGML_Q8_0>(panel, nb, xq, n, out, y_stride, valid, add); break;
        }
    }
#else
    (void)type, (void)packed, (void)rows, (void)cols, (void)p0, (void)p1, (void)xq, (void)n, (void)y,
        (void)y_stride, (void)add;
#endif
}

} // namespace llmd
