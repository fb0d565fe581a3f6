// rows_arm.h — the row dot products of the arm64 variants (kernels.h), in 128-bit
// registers: each 32-element piece is decoded to two vectors of int8 q and multiplied
// with x's int8 values by dot16 (SDOT on dotprod and i8mm, widening multiplies on
// neon). Each is checked against its type's scalar reference by native/tests/
// kernel_test.cpp and tests/test_kernels.py in every variant the CPU runs.
//
// Nibbles unpack by mask and shift, the fifth bits of Q5_0/Q5_1 by testing each byte
// against its bit, the codes of IQ4_NL, IQ4_XS and MXFP4 by a table lookup (TBL),
// the high-bit planes of Q3_K, Q5_K and Q6_K by byte shifts. Integer products with
// their integer scales sum exactly in int32 lanes; every row sums its pieces in one
// fixed order, so a token's result does not depend on the batch it is in.
#pragma once

#include "kernels/arm/simd_arm.h"
#include "kernels/kernels.h"

namespace llmd {
namespace {

// 16 packed nibble bytes: the low nibbles (elements 0..15) and the high (16..31).
inline uint8x16_t low_nibbles(uint8x16_t v) { return vandq_u8(v, vdupq_n_u8(0x0f)); }
inline uint8x16_t high_nibbles(uint8x16_t v) { return vshrq_n_u8(v, 4); }

// A piece's integer dot: q (two vectors of 16) against x's 32 int8 values.
inline int32x4_t dot32(int32x4_t acc, int8x16_t q0, int8x16_t q1, const BlockQ8A &x) {
    return dot16(dot16(acc, q0, load_s8(x.qs)), q1, load_s8(x.qs + 16));
}

// Blocks of 32 with a float scale each: acc += scale × x.d × (integer dot), 4 lanes.
inline float32x4_t scaled(float32x4_t acc, int32x4_t isum, float scale) {
    return vfmaq_n_f32(acc, vcvtq_f32_s32(isum), scale);
}

float dot_q4_0_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK; ++b, w += 18) {
        const uint8x16_t v = load_u8(w + 2);
        const int32x4_t p = dot32(vdupq_n_s32(0), vsubq_s8(as_s8(low_nibbles(v)), eight),
                                  vsubq_s8(as_s8(high_nibbles(v)), eight), x[b]);
        acc = scaled(acc, p, half(w) * x[b].d);
    }
    return vaddvq_f32(acc);
}

float dot_q4_1_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    float offset = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, w += 20) {
        const uint8x16_t v = load_u8(w + 4);
        const int32x4_t p = dot32(vdupq_n_s32(0), as_s8(low_nibbles(v)), as_s8(high_nibbles(v)), x[b]);
        acc = scaled(acc, p, half(w) * x[b].d);
        offset += half(w + 2) * x[b].s;
    }
    return vaddvq_f32(acc) + offset;
}

float dot_q8_0_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK; ++b, w += 34)
        acc = scaled(acc, dot32(vdupq_n_s32(0), load_s8(w + 2), load_s8(w + 18), x[b]), half(w) * x[b].d);
    return vaddvq_f32(acc);
}

// The fifth bits of Q5_0 and Q5_1 (bit i of the word at qh for element i) as 0x10
// in byte i, elements 0..15 (`upper` false) or 16..31: byte i takes the word's byte
// i / 8 and tests its bit i % 8.
inline uint8x16_t fifth_bits(const uint8_t *qh, bool upper) {
    const uint8_t *bytes = qh + (upper ? 2 : 0);
    const uint8x16_t spread = vcombine_u8(vdup_n_u8(bytes[0]), vdup_n_u8(bytes[1]));
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
    return vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10));
}

float dot_q5_0_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK; ++b, w += 22) {
        const uint8x16_t v = load_u8(w + 6);
        const int8x16_t q0 = vsubq_s8(as_s8(vorrq_u8(low_nibbles(v), fifth_bits(w + 2, false))), sixteen);
        const int8x16_t q1 = vsubq_s8(as_s8(vorrq_u8(high_nibbles(v), fifth_bits(w + 2, true))), sixteen);
        acc = scaled(acc, dot32(vdupq_n_s32(0), q0, q1, x[b]), half(w) * x[b].d);
    }
    return vaddvq_f32(acc);
}

float dot_q5_1_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    float offset = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b, w += 24) {
        const uint8x16_t v = load_u8(w + 8);
        const uint8x16_t u0 = vorrq_u8(low_nibbles(v), fifth_bits(w + 4, false));
        const uint8x16_t u1 = vorrq_u8(high_nibbles(v), fifth_bits(w + 4, true));
        acc = scaled(acc, dot32(vdupq_n_s32(0), as_s8(u0), as_s8(u1), x[b]), half(w) * x[b].d);
        offset += half(w + 2) * x[b].s;
    }
    return vaddvq_f32(acc) + offset;
}

// IQ4_NL: nibbles are codes into Table (kIQ4NL).
template <const int8_t (&Table)[16]>
float dot_iq4_nl_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const int8x16_t table = vld1q_s8(Table);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK; ++b, w += 18) {
        const uint8x16_t v = load_u8(w + 2);
        const int32x4_t p = dot32(vdupq_n_s32(0), vqtbl1q_s8(table, low_nibbles(v)),
                                  vqtbl1q_s8(table, high_nibbles(v)), x[b]);
        acc = scaled(acc, p, half(w) * x[b].d);
    }
    return vaddvq_f32(acc);
}

// 2^(e - 128), MXFP4's scale 2^(e - 127) halved as its doubled code table wants;
// e = 0 and 1 give the subnormals 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e >= 2 ? static_cast<uint32_t>(e - 1) << 23 : 0x00800000u >> (2 - e);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// MXFP4: an e8m0 exponent, then nibbles that are codes into Table (kFP4).
template <const int8_t (&Table)[16]>
float dot_mxfp4_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const int8x16_t table = vld1q_s8(Table);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK; ++b, w += 17) {
        const uint8x16_t v = load_u8(w + 1);
        const int32x4_t p = dot32(vdupq_n_s32(0), vqtbl1q_s8(table, low_nibbles(v)),
                                  vqtbl1q_s8(table, high_nibbles(v)), x[b]);
        acc = scaled(acc, p, e8m0_half(w[0]) * x[b].d);
    }
    return vaddvq_f32(acc);
}

// ---- K-quant super-blocks of 256 -----------------------------------------------
//
// x is quantized with one scale per 256 elements (Activation::Q8K), so a super-block's
// integer products, each 16 elements' times their integer scale, add up exactly in
// int32 lanes (at most 256 × 127 × 128 × 64 in magnitude) before one float multiply
// by d × x.d. Offsets (Q3_K's q = u - 4, Q6_K's q = u - 32) come off the bytes before
// the multiply: q fits an int8.

// isum + lo × (q0 · x[0..15]) + hi × (q1 · x[16..31]).
inline int32x4_t scaled_halves(int32x4_t isum, int8x16_t q0, int8x16_t q1, const BlockQ8A &x, int lo, int hi) {
    isum = vmlaq_n_s32(isum, dot16(vdupq_n_s32(0), q0, load_s8(x.qs)), lo);
    return vmlaq_n_s32(isum, dot16(vdupq_n_s32(0), q1, load_s8(x.qs + 16)), hi);
}

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
template <bool kFifth> float dot_q4_5_k_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    constexpr int64_t kBytes = kFifth ? 176 : 144;
    constexpr int kNibbles = kFifth ? 48 : 16;
    const uint8x16_t fifth = vdupq_n_u8(0x10);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += kBytes, x += 8) {
        uint8_t scale[8], min[8];
        scales_mins_k4(w + 4, scale, min);
        uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if constexpr (kFifth) qh[0] = load_u8(w + 16), qh[1] = load_u8(w + 32);
        int32x4_t isum = vdupq_n_s32(0);
        int32_t msum = 0;
        for (int j = 0; j < 8; j += 2) {
            uint8x16_t u0[2], u1[2];
            for (int h = 0; h < 2; ++h) {
                const uint8x16_t v = load_u8(w + kNibbles + 16 * j + 16 * h);
                u0[h] = low_nibbles(v);
                u1[h] = high_nibbles(v);
                if constexpr (kFifth) {
                    u0[h] = vorrq_u8(u0[h], vandq_u8(vshlq_n_u8(qh[h], 4), fifth));
                    u1[h] = vorrq_u8(u1[h], vandq_u8(vshlq_n_u8(qh[h], 3), fifth));
                    qh[h] = vshrq_n_u8(qh[h], 2);
                }
            }
            isum = scaled_halves(isum, as_s8(u0[0]), as_s8(u0[1]), x[j], scale[j], scale[j]);
            isum = scaled_halves(isum, as_s8(u1[0]), as_s8(u1[1]), x[j + 1], scale[j + 1], scale[j + 1]);
            msum += min[j] * x[j].sum + min[j + 1] * x[j + 1].sum;
        }
        acc = scaled(acc, isum, half(w) * x[0].d);
        mins += half(w + 2) * x[0].d * static_cast<float>(msum);
    }
    return vaddvq_f32(acc) - mins;
}

// Q6_K: in each half h, sub-block 4h + t takes the low (t < 2) or high nibbles of the
// 32 bytes at ql + 64h + 32 (t % 2), and bits 2t, 2t + 1 of the 32 bytes at qh + 32h
// as bits 4 and 5; q = u - 32, with a signed int8 scale per 16 elements.
float dot_q6_k_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const uint8x16_t high = vdupq_n_u8(0x30);
    const int8x16_t offset = vdupq_n_s8(32);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < n / QK_K; ++s, w += 210, x += 8) {
        const auto *scale = reinterpret_cast<const int8_t *>(w + 192);
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; ++h) {
            int8x16_t q[4][2]; // sub-block t, 16-element half e
            for (int e = 0; e < 2; ++e) {
                const uint8x16_t ql0 = load_u8(w + 64 * h + 16 * e), ql1 = load_u8(w + 64 * h + 32 + 16 * e);
                const uint8x16_t qh = load_u8(w + 128 + 32 * h + 16 * e);
                const uint8x16_t u[4] = {
                    vorrq_u8(low_nibbles(ql0), vandq_u8(vshlq_n_u8(qh, 4), high)),
                    vorrq_u8(low_nibbles(ql1), vandq_u8(vshlq_n_u8(qh, 2), high)),
                    vorrq_u8(high_nibbles(ql0), vandq_u8(qh, high)),
                    vorrq_u8(high_nibbles(ql1), vandq_u8(vshrq_n_u8(qh, 2), high)),
                };
                for (int t = 0; t < 4; ++t) q[t][e] = vsubq_s8(as_s8(u[t]), offset);
            }
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * h + t;
                isum = scaled_halves(isum, q[t][0], q[t][1], x[j], scale[2 * j], scale[2 * j + 1]);
            }
        }
        acc = scaled(acc, isum, half(w + 208) * x[0].d);
    }
    return vaddvq_f32(acc);
}

// The 16 scales of Q3_K from their 12 bytes, minus 32: scale i has its low nibble in
// byte i % 8 (the high nibble for i >= 8) and its top two bits in byte 8 + i % 4,
// at bit 2 (i / 4).
inline void scales_q3_k(const uint8_t *packed, int8_t scale[16]) {
    uint32_t s[3];
    std::memcpy(s, packed, 12);
    const uint32_t v[4] = {(s[0] & 0x0f0f0f0f) | (s[2] & 0x03030303) << 4,
                           (s[1] & 0x0f0f0f0f) | (s[2] >> 2 & 0x03030303) << 4,
                           (s[0] >> 4 & 0x0f0f0f0f) | (s[2] >> 4 & 0x03030303) << 4,
                           (s[1] >> 4 & 0x0f0f0f0f) | (s[2] >> 6 & 0x03030303) << 4};
    vst1q_s8(scale, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(v)), vdupq_n_s8(32)));
}

// Q3_K: in each half h, sub-block 4h + t takes bits 2t, 2t + 1 of the 32 bytes at
// qs + 32h, plus 4 where bit 4h + t of the 32 bytes of hmask is set (hmask shifts right
// as the sub-blocks advance); q = u - 4.
float dot_q3_k_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const uint8x16_t two = vdupq_n_u8(3), four = vdupq_n_u8(4);
    const int8x16_t offset = vdupq_n_s8(4);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < n / QK_K; ++s, w += 110, x += 8) {
        int8_t scale[16];
        scales_q3_k(w + 96, scale);
        uint8x16_t hmask[2] = {load_u8(w), load_u8(w + 16)};
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; ++h) {
            const uint8x16_t qs[2] = {load_u8(w + 32 + 32 * h), load_u8(w + 48 + 32 * h)};
            for (int t = 0; t < 4; ++t) {
                int8x16_t q[2];
                for (int e = 0; e < 2; ++e) {
                    const uint8x16_t u = vorrq_u8(vandq_u8(vshlq_u8(qs[e], vdupq_n_s8(static_cast<int8_t>(-2 * t))), two),
                                                  vandq_u8(vshlq_n_u8(hmask[e], 2), four));
                    hmask[e] = vshrq_n_u8(hmask[e], 1);
                    q[e] = vsubq_s8(as_s8(u), offset);
                }
                const int j = 4 * h + t;
                isum = scaled_halves(isum, q[0], q[1], x[j], scale[2 * j], scale[2 * j + 1]);
            }
        }
        acc = scaled(acc, isum, half(w + 108) * x[0].d);
    }
    return vaddvq_f32(acc);
}

// Q2_K: sub-block 4h + t takes bits 2t, 2t + 1 of the 32 bytes at qs + 32h; each
// 16 elements have a byte of 4-bit scale (low) and min (high).
float dot_q2_k_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const uint8x16_t two = vdupq_n_u8(3);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    for (int64_t s = 0; s < n / QK_K; ++s, w += 84, x += 8) {
        int32x4_t isum = vdupq_n_s32(0);
        int32_t msum = 0;
        for (int h = 0; h < 2; ++h) {
            const uint8x16_t qs[2] = {load_u8(w + 16 + 32 * h), load_u8(w + 32 + 32 * h)};
            for (int t = 0; t < 4; ++t) {
                const int j = 4 * h + t, lo = w[2 * j], hi = w[2 * j + 1];
                const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * t));
                isum = scaled_halves(isum, as_s8(vandq_u8(vshlq_u8(qs[0], shift), two)),
                                     as_s8(vandq_u8(vshlq_u8(qs[1], shift), two)), x[j], lo & 15, hi & 15);
                msum += (lo >> 4) * x[j].sum_lo + (hi >> 4) * (x[j].sum - x[j].sum_lo);
            }
        }
        acc = scaled(acc, isum, half(w + 80) * x[0].d);
        mins += half(w + 82) * x[0].d * static_cast<float>(msum);
    }
    return vaddvq_f32(acc) - mins;
}

// IQ4_XS: sub-block j's 16 bytes of codes into Table (kIQ4NL) at 8 + 16j, its 6-bit
// scale (minus 32) from nibble j of bytes 4..7 and bits 2j, 2j + 1 of the u16 at 2.
template <const int8_t (&Table)[16]>
float dot_iq4_xs_neon(const uint8_t *w, const float *, const BlockQ8A *x, int64_t n) {
    const int8x16_t table = vld1q_s8(Table);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < n / QK_K; ++s, w += 136, x += 8) {
        uint16_t high;
        std::memcpy(&high, w + 2, 2);
        int32x4_t isum = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            const int scale = ((w[4 + j / 2] >> 4 * (j % 2) & 15) | (high >> 2 * j & 3) << 4) - 32;
            const uint8x16_t v = load_u8(w + 8 + 16 * j);
            const int32x4_t p = dot32(vdupq_n_s32(0), vqtbl1q_s8(table, low_nibbles(v)),
                                      vqtbl1q_s8(table, high_nibbles(v)), x[j]);
            isum = vmlaq_n_s32(isum, p, scale);
        }
        acc = scaled(acc, isum, half(w) * x[0].d);
    }
    return vaddvq_f32(acc);
}

// ---- float types -------------------------------------------------------------
//
// Two chains of 4 lanes: an FMA's latency is several times its issue interval.

float dot_f32_neon(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    const auto *w = reinterpret_cast<const float *>(row);
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 2; ++h) acc[h] = vfmaq_f32(acc[h], vld1q_f32(w + i + 4 * h), vld1q_f32(x + i + 4 * h));
    float r = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
    for (; i < n; ++i) r += w[i] * x[i];
    return r;
}

float dot_f16_neon(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    const auto *w = reinterpret_cast<const uint16_t *>(row);
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 2; ++h) acc[h] = vfmaq_f32(acc[h], f16x4(w + i + 4 * h), vld1q_f32(x + i + 4 * h));
    float r = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
    for (; i < n; ++i) r += half(row + 2 * i) * x[i];
    return r;
}

// bf16 is the top half of an f32: widen to 32 bits with a shift into place.
float dot_bf16_neon(const uint8_t *row, const float *x, const BlockQ8A *, int64_t n) {
    const auto *w = reinterpret_cast<const uint16_t *>(row);
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 2; ++h) {
            const float32x4_t wf = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(w + i + 4 * h), 16));
            acc[h] = vfmaq_f32(acc[h], wf, vld1q_f32(x + i + 4 * h));
        }
    float r = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
    for (; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        r += f * x[i];
    }
    return r;
}

// The row dots into a variant's table.
void set_row_dots(Kernels &k) {
    k.dot[GGML_F32] = dot_f32_neon;
    k.dot[GGML_F16] = dot_f16_neon;
    k.dot[GGML_BF16] = dot_bf16_neon;
    k.dot[GGML_Q4_0] = dot_q4_0_neon;
    k.dot[GGML_Q4_1] = dot_q4_1_neon;
    k.dot[GGML_Q5_0] = dot_q5_0_neon;
    k.dot[GGML_Q5_1] = dot_q5_1_neon;
    k.dot[GGML_Q8_0] = dot_q8_0_neon;
    k.dot[GGML_IQ4_NL] = dot_iq4_nl_neon<kIQ4NL>;
    k.dot[GGML_MXFP4] = dot_mxfp4_neon<kFP4>;
    k.dot[GGML_Q2_K] = dot_q2_k_neon;
    k.dot[GGML_Q3_K] = dot_q3_k_neon;
    k.dot[GGML_Q4_K] = dot_q4_5_k_neon<false>;
    k.dot[GGML_Q5_K] = dot_q4_5_k_neon<true>;
    k.dot[GGML_Q6_K] = dot_q6_k_neon;
    k.dot[GGML_IQ4_XS] = dot_iq4_xs_neon<kIQ4NL>;
}

} // namespace
} // namespace llmd
