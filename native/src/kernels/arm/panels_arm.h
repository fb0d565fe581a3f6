// panels_arm.h — the kernel over repacked panels (quants.h) of the arm64 variants
// with dot-product instructions (dotprod, i8mm), one instantiation per panel layout.
//
// A panel-block's w[g] (64 bytes: rows 0..15 × elements 4g..4g+3) is 4 q-registers,
// each 4 rows × 4 elements: the lane form of SDOT (USDOT on i8mm) multiplies one by
// the 4 activation bytes 4g..4g+3 held in one lane of a 16-byte register of x, and
// adds each row's 4 products into that row's int32 lane. A piece is 32 of them per
// token: 8 accumulators (4 row groups × elements 0..15 and 16..31) and no horizontal
// sum. i8mm takes tokens in pairs through USMMLA instead (pair_sums), 16 instructions
// a token. The piece's weights are unpacked once (into L1, 512 bytes) and serve a
// tile of up to kPanelTile tokens.
//
// Signedness: SDOT is s8 × s8, so weights go in as the layout's u = q + offset where
// u < 128 (every layout of 2 to 6 bits) with the offset taken off exactly in integers
// (offset × the sum of x's int8 values, which BlockQ8A carries), as q itself where
// a table gives it (4-bit codes) and as u ^ 0x80 = q for 8 bits. USDOT and USMMLA
// are u8 × s8 and take every layout's u as stored (codes looked up as lut + offset),
// the offset taken off the same way.
// A piece's integer sums are exact whichever instruction forms them, and each token
// accumulates its pieces in floats in one fixed order whatever tile, pair or thread
// it runs in: results are batch-invariant.
#pragma once

#include "kernels/arm/simd_arm.h"
#include "kernels/kernels.h"

#include <algorithm>

namespace llmd {
namespace {

#if defined(__ARM_FEATURE_MATMUL_INT8)
constexpr bool kUnsignedDot = true;
#else
constexpr bool kUnsignedDot = false;
#endif

// The offset taken off a layout's products in integers: the layout's own, except
// where the weights go into SDOT as q.
template <const PanelLayout &L> constexpr int dot_offset() {
    return kUnsignedDot || (L.lut == nullptr && L.bits != 8) ? L.offset : 0;
}

// acc + each row's 4 weights of w (4 rows × 4 bytes) times x's bytes 4 Lane..4 Lane + 3.
template <int Lane> inline int32x4_t dot_lane(int32x4_t acc, const uint8_t *w, int8x16_t x) {
#if defined(__ARM_FEATURE_MATMUL_INT8)
    return vusdotq_laneq_s32(acc, vld1q_u8(w), x, Lane);
#else
    return vdotq_laneq_s32(acc, vld1q_s8(reinterpret_cast<const int8_t *>(w)), x, Lane);
#endif
}

// s[r] (rows 4r..4r+3) + w[g] times x's bytes 4 Lane..4 Lane + 3.
template <int Lane> inline void dot_rows(int32x4_t s[4], const uint8_t *wg, int8x16_t x) {
    for (int r = 0; r < 4; ++r) s[r] = dot_lane<Lane>(s[r], wg + 16 * r, x);
}

// Each byte of v shifted left by s bits (right for s < 0).
inline uint8x16_t shift_bytes(uint8x16_t v, int s) { return vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(s))); }

// A panel-block's weights as the bytes the dot instruction takes (see above), w[g]
// at 64 g: unpacked from the layout's planes into `buf`, or, for 8-bit USDOT, the
// block itself.
template <const PanelLayout &L> inline const uint8_t *unpack_weights(const uint8_t *blk, uint8_t *buf) {
    constexpr int low = panel_low_bits(L), high = L.bits - low;
    if constexpr (low == 8) {
        if constexpr (kUnsignedDot) return blk;
        for (int i = 0; i < 512; i += 16) vst1q_u8(buf + i, veorq_u8(load_u8(blk + i), vdupq_n_u8(0x80)));
        return buf;
    } else {
        if constexpr (low == 4) {
            for (int j = 0; j < 4; ++j)
                for (int r = 0; r < 4; ++r) {
                    const uint8x16_t v = load_u8(blk + 64 * j + 16 * r);
                    vst1q_u8(buf + 64 * j + 16 * r, vandq_u8(v, vdupq_n_u8(0x0f)));
                    vst1q_u8(buf + 64 * (j + 4) + 16 * r, vshrq_n_u8(v, 4));
                }
        } else {
            for (int m = 0; m < 2; ++m)
                for (int r = 0; r < 4; ++r) {
                    const uint8x16_t v = load_u8(blk + 64 * m + 16 * r);
                    for (int c = 0; c < 4; ++c)
                        vst1q_u8(buf + 64 * (4 * m + c) + 16 * r, vandq_u8(shift_bytes(v, -2 * c), vdupq_n_u8(3)));
                }
        }
        // The high plane's bits for w[g], moved above the low ones.
        const uint8_t *hp = blk + 64 * low;
        if constexpr (high == 2) {
            const uint8x16_t mask = vdupq_n_u8(static_cast<uint8_t>(3 << low));
            for (int m = 0; m < 2; ++m)
                for (int r = 0; r < 4; ++r) {
                    const uint8x16_t h = load_u8(hp + 64 * m + 16 * r);
                    for (int c = 0; c < 4; ++c) {
                        uint8_t *at = buf + 64 * (4 * m + c) + 16 * r;
                        vst1q_u8(at, vorrq_u8(load_u8(at), vandq_u8(shift_bytes(h, low - 2 * c), mask)));
                    }
                }
        } else if constexpr (high == 1) {
            const uint8x16_t mask = vdupq_n_u8(static_cast<uint8_t>(1 << low));
            for (int r = 0; r < 4; ++r) {
                const uint8x16_t h = load_u8(hp + 16 * r);
                for (int g = 0; g < 8; ++g) {
                    uint8_t *at = buf + 64 * g + 16 * r;
                    vst1q_u8(at, vorrq_u8(load_u8(at), vandq_u8(shift_bytes(h, low - g), mask)));
                }
            }
        }
        if constexpr (L.lut != nullptr) { // codes to q (SDOT) or to u = q + offset (USDOT)
            alignas(16) uint8_t t[16];
            for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(L.lut[i] + (kUnsignedDot ? L.offset : 0));
            const uint8x16_t table = vld1q_u8(t);
            for (int i = 0; i < 512; i += 16) vst1q_u8(buf + i, vqtbl1q_u8(table, load_u8(buf + i)));
        }
        return buf;
    }
}

// 16 rows' floats: 16 f16 values, 16 f32, or 16 int8 integers.
inline void f16_rows(const uint8_t *p, float32x4_t v[4]) {
    for (int i = 0; i < 4; ++i) v[i] = f16x4(reinterpret_cast<const uint16_t *>(p) + 4 * i);
}
inline void f32_rows(const uint8_t *p, float32x4_t v[4]) {
    for (int i = 0; i < 4; ++i) v[i] = vld1q_f32(reinterpret_cast<const float *>(p) + 4 * i);
}
inline void int8_rows(const uint8_t *p, float32x4_t v[4]) {
    const int8x16_t b = load_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    v[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    v[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

// The 16 rows' scales (and mins) of the piece at blk, set h for split layouts'
// elements 16..31: f16 or f32 floats, or a k_scales layout's integer scales, and its
// integer mins times the rows' m (f16 times a small integer, exact).
template <const PanelLayout &L>
inline void piece_scales(const uint8_t *blk, const float32x4_t m[4], float32x4_t scale[2][4], float32x4_t min[2][4]) {
    constexpr size_t kW = panel_weight_bytes(L), kSet = kPanel * (L.k_scales ? 1 : L.f16 ? 2 : 4);
    constexpr int kSets = L.split ? 2 : 1;
    for (int h = 0; h < kSets; ++h) {
        const uint8_t *s = blk + kW + h * kSet, *mn = blk + kW + (kSets + h) * kSet;
        if constexpr (L.k_scales) {
            int8_rows(s, scale[h]);
            if constexpr (L.mins) {
                int8_rows(mn, min[h]);
                for (int i = 0; i < 4; ++i) min[h][i] = vmulq_f32(m[i], min[h][i]);
            }
        } else if constexpr (L.f16) {
            f16_rows(s, scale[h]);
            if constexpr (L.mins) f16_rows(mn, min[h]);
        } else {
            f32_rows(s, scale[h]);
            if constexpr (L.mins) f32_rows(mn, min[h]);
        }
    }
}

// One token's integer sums of a piece, rows 4r..4r+3 in lane r of lo[r] (elements
// 0..15) and hi[r] (16..31), the offset taken off: SDOT/USDOT lane forms, 32 of them.
template <const PanelLayout &L> inline void lane_sums(const uint8_t *w, const BlockQ8A &xb, int32x4_t lo[4], int32x4_t hi[4]) {
    constexpr int kOffset = dot_offset<L>();
    const int32_t lo_sum = L.split ? xb.sum_lo : xb.sum;
    for (int r = 0; r < 4; ++r) {
        lo[r] = vdupq_n_s32(-kOffset * lo_sum);
        hi[r] = vdupq_n_s32(-kOffset * (xb.sum - lo_sum));
    }
    const int8x16_t xl = load_s8(xb.qs), xh = load_s8(xb.qs + 16);
    dot_rows<0>(lo, w, xl);
    dot_rows<0>(hi, w + 256, xh);
    dot_rows<1>(lo, w + 64, xl);
    dot_rows<1>(hi, w + 320, xh);
    dot_rows<2>(lo, w + 128, xl);
    dot_rows<2>(hi, w + 384, xh);
    dot_rows<3>(lo, w + 192, xl);
    dot_rows<3>(hi, w + 448, xh);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// USMMLA multiplies a 2 × 8 matrix of u8 by an 8 × 2 of s8: two rows' 8 weights
// against two tokens' 8 activations, 32 products an instruction to SDOT's 16. The
// piece's weights are regrouped once for it: w[2k] and w[2k + 1] (elements 8k..8k+7)
// of rows 4r..4r+3, zipped by 32-bit lanes, give rows (4r, 4r + 1) and (4r + 2,
// 4r + 3) as 8 bytes each, stored at 16 (8k + 2r) and 16 (8k + 2r + 1).
inline void pair_weights(const uint8_t *w, uint8_t *pairs) {
    for (int k = 0; k < 4; ++k)
        for (int r = 0; r < 4; ++r) {
            const uint32x4_t a = vreinterpretq_u32_u8(load_u8(w + 128 * k + 16 * r));
            const uint32x4_t c = vreinterpretq_u32_u8(load_u8(w + 128 * k + 64 + 16 * r));
            vst1q_u8(pairs + 16 * (8 * k + 2 * r), vreinterpretq_u8_u32(vzip1q_u32(a, c)));
            vst1q_u8(pairs + 16 * (8 * k + 2 * r + 1), vreinterpretq_u8_u32(vzip2q_u32(a, c)));
        }
}

// Two tokens' integer sums of a piece, as lane_sums gives each (the same integers:
// a piece's integer dot is exact however it is formed, so a token's bits do not
// depend on whether it shares the instruction with another). Row pair q's
// accumulator holds (row 2q, row 2q + 1) × (token a, token b); unzipping two of them
// gives 4 rows of one token.
template <const PanelLayout &L>
inline void pair_sums(const uint8_t *pairs, const BlockQ8A &xa, const BlockQ8A &xb, int32x4_t lo[2][4],
                      int32x4_t hi[2][4]) {
    constexpr int kOffset = dot_offset<L>();
    const int32_t a_lo = L.split ? xa.sum_lo : xa.sum, b_lo = L.split ? xb.sum_lo : xb.sum;
    const int32x2_t init_lo = {-kOffset * a_lo, -kOffset * b_lo};
    const int32x2_t init_hi = {-kOffset * (xa.sum - a_lo), -kOffset * (xb.sum - b_lo)};
    int32x4_t s[2][8]; // elements 0..15 and 16..31; row pair q
    for (int q = 0; q < 8; ++q) {
        s[0][q] = vcombine_s32(init_lo, init_lo);
        s[1][q] = vcombine_s32(init_hi, init_hi);
    }
    for (int k = 0; k < 4; ++k) {
        const int8x16_t x = vcombine_s8(vld1_s8(xa.qs + 8 * k), vld1_s8(xb.qs + 8 * k));
        for (int q = 0; q < 8; ++q) s[k / 2][q] = vusmmlaq_s32(s[k / 2][q], load_u8(pairs + 16 * (8 * k + q)), x);
    }
    for (int r = 0; r < 4; ++r) {
        lo[0][r] = vuzp1q_s32(s[0][2 * r], s[0][2 * r + 1]);
        lo[1][r] = vuzp2q_s32(s[0][2 * r], s[0][2 * r + 1]);
        hi[0][r] = vuzp1q_s32(s[1][2 * r], s[1][2 * r + 1]);
        hi[1][r] = vuzp2q_s32(s[1][2 * r], s[1][2 * r + 1]);
    }
}
#endif

// One token's float step for a piece: its integer sums times the rows' scales into
// acc (with the token's d) or, for k_scales layouts, into part; the rows' mins times
// the token's sums into acc.
template <const PanelLayout &L>
inline void piece_step(const int32x4_t lo[4], const int32x4_t hi[4], const float32x4_t scale[2][4],
                       const float32x4_t min[2][4], const BlockQ8A &xb, float32x4_t acc[4], float32x4_t part[4]) {
    for (int r = 0; r < 4; ++r) {
        float32x4_t &a = acc[r], &pt = part[r];
        if constexpr (!L.split) {
            const float32x4_t s = vcvtq_f32_s32(vaddq_s32(lo[r], hi[r]));
            if constexpr (L.k_scales) pt = vfmaq_f32(pt, scale[0][r], s);
            else a = vfmaq_f32(a, vmulq_n_f32(scale[0][r], xb.d), s);
            if constexpr (L.mins) a = vfmaq_n_f32(a, min[0][r], xb.s);
        } else {
            const float32x4_t sl = vcvtq_f32_s32(lo[r]), sh = vcvtq_f32_s32(hi[r]);
            if constexpr (L.k_scales) {
                pt = vfmaq_f32(pt, scale[0][r], sl);
                pt = vfmaq_f32(pt, scale[1][r], sh);
            } else {
                a = vfmaq_f32(a, vmulq_n_f32(scale[0][r], xb.d), sl);
                a = vfmaq_f32(a, vmulq_n_f32(scale[1][r], xb.d), sh);
            }
            if constexpr (L.mins) {
                a = vfmaq_n_f32(a, min[0][r], xb.d * static_cast<float>(xb.sum_lo));
                a = vfmaq_n_f32(a, min[1][r], xb.d * static_cast<float>(xb.sum - xb.sum_lo));
            }
        }
    }
}

// Tokens sharing one unpacking of a piece's weights. Each token's float sums stay in
// memory between pieces (8 q-registers, 16 with a K-quant's part sums, against 32
// dot products a piece), so the tile's width costs no registers.
constexpr int kPanelTile = 8;

// tn tokens (x0 + t nb, y0 + t y_stride) against one panel: the rows' dot products.
template <const PanelLayout &L>
void panel_tile(const uint8_t *panel, int64_t nb, const BlockQ8A *x0, int tn, float *y0, int64_t y_stride,
                int valid, bool add) {
    // k_scales layouts serve 256-element types, whose activations (Q8K) share one d
    // per 256: a super-block's scaled piece sums gather in part[t] and meet the rows'
    // d and the token's x.d once, after its 8 pieces.
    constexpr int64_t kGroup = L.k_scales ? QK_K / QK : 1;
    float32x4_t acc[kPanelTile][4], part[kPanelTile][4];
    for (int t = 0; t < tn; ++t)
        for (int i = 0; i < 4; ++i) acc[t][i] = part[t][i] = vdupq_n_f32(0.0f);
    alignas(16) uint8_t buf[512];
#if defined(__ARM_FEATURE_MATMUL_INT8)
    alignas(16) uint8_t buf_pairs[512];
#endif
    for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
        float32x4_t d[4], m[4]; // k_scales: the rows' d and m of this 256
        for (int i = 0; i < 4; ++i) d[i] = m[i] = vdupq_n_f32(0.0f);
        if constexpr (L.k_scales) {
            const uint8_t *header = panel_header(L, panel, b0);
            f16_rows(header, d);
            if constexpr (L.mins) f16_rows(header + 2 * kPanel, m);
        }
        for (int64_t b = b0; b < b0 + kGroup; ++b) {
            const uint8_t *blk = panel + panel_piece_offset(L, b);
            const uint8_t *w = unpack_weights<L>(blk, buf);
            float32x4_t scale[2][4], min[2][4];
            piece_scales<L>(blk, m, scale, min);
            int t = 0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
            if (tn >= 2) pair_weights(w, buf_pairs);
            for (; t + 2 <= tn; t += 2) {
                const BlockQ8A &xa = x0[t * nb + b], &xb = x0[(t + 1) * nb + b];
                int32x4_t lo[2][4], hi[2][4];
                pair_sums<L>(buf_pairs, xa, xb, lo, hi);
                piece_step<L>(lo[0], hi[0], scale, min, xa, acc[t], part[t]);
                piece_step<L>(lo[1], hi[1], scale, min, xb, acc[t + 1], part[t + 1]);
            }
#endif
            for (; t < tn; ++t) {
                const BlockQ8A &xb = x0[t * nb + b];
                int32x4_t lo[4], hi[4];
                lane_sums<L>(w, xb, lo, hi);
                piece_step<L>(lo, hi, scale, min, xb, acc[t], part[t]);
            }
        }
        if constexpr (L.k_scales)
            for (int t = 0; t < tn; ++t) {
                const float xd = x0[t * nb + b0 + kGroup - 1].d;
                for (int r = 0; r < 4; ++r) {
                    acc[t][r] = vfmaq_f32(acc[t][r], vmulq_n_f32(d[r], xd), part[t][r]);
                    part[t][r] = vdupq_n_f32(0.0f);
                }
            }
    }
    for (int t = 0; t < tn; ++t) {
        float *y = y0 + t * y_stride;
        if (valid == kPanel) { // a whole panel in vector moves; the loop below compiles to a call of memcpy
            for (int r = 0; r < 4; ++r) vst1q_f32(y + 4 * r, add ? vaddq_f32(vld1q_f32(y + 4 * r), acc[t][r]) : acc[t][r]);
            continue;
        }
        alignas(16) float out[kPanel];
        for (int r = 0; r < 4; ++r) vst1q_f32(out + 4 * r, acc[t][r]);
        for (int i = 0; i < valid; ++i) y[i] = add ? y[i] + out[i] : out[i];
    }
}

template <const PanelLayout &L>
void panel_matmul(const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1, const BlockQ8A *xq,
                  int n, float *y, int64_t y_stride, bool add) {
    const int64_t nb = cols / QK;
    const size_t pbytes = panel_bytes(L, nb);
    for (int64_t p = p0; p < p1; ++p) {
        const uint8_t *panel = packed + static_cast<size_t>(p) * pbytes;
        const int valid = static_cast<int>(std::min<int64_t>(kPanel, rows - p * kPanel));
        for (int t0 = 0; t0 < n; t0 += kPanelTile)
            panel_tile<L>(panel, nb, xq + t0 * nb, std::min(kPanelTile, n - t0), y + t0 * y_stride + p * kPanel,
                          y_stride, valid, add);
    }
}

// The kernel of each layout, for set_panels (kernels.h).
template <const PanelLayout &L> struct PanelsArm {
    static constexpr PanelFn matmul = panel_matmul<L>;
};

} // namespace
} // namespace llmd
