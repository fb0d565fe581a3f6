// simd_arm.h — small vector helpers shared by the arm64 variants (neon, dotprod,
// i8mm): the same sources, built with and without the dot-product instructions
// (build_native.py), pick them here.
#pragma once

#include <arm_neon.h>
#include <cstdint>
#include <cstring>

namespace llmd {
namespace {

// acc + the s8 × s8 products of 16 bytes, whose 4 lanes' total is their dot product.
// SDOT where the variant has it (lane i: bytes 4i..4i+3); else widening multiplies and
// pairwise adds (lane i: bytes 2i, 2i + 1, 2i + 8 and 2i + 9; no int16 sum can
// overflow: one product is at most 128 × 128).
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// dot16 with lane i the products of bytes 4i..4i+3 in every variant: without SDOT
// one more pairwise add than dot16's.
inline int32x4_t dot16_by4(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vaddq_s32(acc, vpaddq_s32(lo, vpaddlq_s16(vmull_high_s8(a, b))));
#endif
}

inline float half(const uint8_t *p) {
    __fp16 h;
    std::memcpy(&h, p, 2);
    return static_cast<float>(h);
}

inline int8x16_t load_s8(const void *p) { return vld1q_s8(static_cast<const int8_t *>(p)); }
inline uint8x16_t load_u8(const void *p) { return vld1q_u8(static_cast<const uint8_t *>(p)); }
inline int8x16_t as_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

// 4 f16 values (bits) as floats.
inline float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

// e^x for x in [-87, 88] (x clamped to it): 2^n * e^r with |r| <= ln2 / 2 and a
// degree-7 Taylor polynomial (relative error below 1e-7), as the avx512 variant's exp512.
inline float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f)); // ln 2, high bits
    r = vfmsq_f32(r, n, vdupq_n_f32(1.42860682030941723e-6f));       // ln 2, the rest
    static constexpr float kTaylor[] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    for (const float c : kTaylor) p = vfmaq_f32(vdupq_n_f32(c), p, r);
    // 2^n for n in -126..127 (x is clamped), built in the exponent field.
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

// tanh(y), the avx512 variant's tanh512 arithmetic 4 lanes at a time: (1 - e^-2|y|) /
// (1 + e^-2|y|) with y's sign.
inline float32x4_t tanh4(float32x4_t y) {
    const float32x4_t t = exp4(vmulq_n_f32(vabsq_f32(y), -2.0f));
    const float32x4_t r = vdivq_f32(vsubq_f32(vdupq_n_f32(1.0f), t), vaddq_f32(vdupq_n_f32(1.0f), t));
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(r), vandq_u32(sign, vreinterpretq_u32_f32(y))));
}

} // namespace
} // namespace llmd
