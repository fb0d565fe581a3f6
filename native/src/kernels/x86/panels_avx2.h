// panels_avx2.h — the kernel of the 256-bit variants (avx2, avx-vnni) over repacked
// panels (quants.h): one instantiation per panel layout, the same packed bytes as
// panels_avx512.h reads; the entry point is panel_matmul_avx2<L>, a PanelFn.
//
// A panel-block's group g (w[g] of PanelLayout: rows 0..15 × elements 4g..4g+3) is
// two 256-bit vectors, rows 0..7 and rows 8..15. Without VNNI a u8 × s8 product takes
// vpmaddubsw, which sums adjacent products into int16 lanes and saturates, then
// vpmaddwd, which sums the int16 lanes in pairs into int32 (times ones, or times a
// K-quant's integer scales directly). The int16 lanes of several groups are added
// first (a row's two int16 lanes each gather 2 elements a group), wrapping adds
// whose true sum must fit int16: with activations |x| <= 127 (quantize_block:
// d = amax / 127, round to nearest) and operands 0 <= u <= umax, `chunk_groups`
// groups of 2 × umax × 127 each:
//   umax 15 (4-bit: Q4_0, Q4_1, Q4_K) or less (Q2_K, Q3_K): 8 groups, 30480;
//   31 (5-bit: Q5_0, Q5_1, Q5_K) and 24 (MXFP4 as q + 12): 4 groups, 31496 / 24384;
//   63 (Q6_K): 2 groups, 32004.
// Operands past 129 would saturate a single vpmaddubsw (Q8_0's u = q + 128, IQ4_NL's
// and IQ4_XS's q + 127): those multiply as signed q, |q| <= 128, through the sign
// trick |q| × (x · sign(q)) (each pair at most 2 × 128 × 127 = 32512), one group at
// a time. Offsets come off exactly in integers through x's block sums, so a piece's
// integer dot is exact and only the float scaling rounds.
//
// The unpacked weights of a group serve a tile of T tokens (tile_tokens)
// while each token's int16 sums stay in registers; 16 vector registers bound T.
// With VNNI (the avx-vnni variant) none of that holds back the products: vpdpbusd sums
// four u8 × s8 products into int32 lanes without saturating, so every layout's operand
// is unsigned, u = q + operand_offset, and a piece's groups go straight into one int32
// sum per token and half (tile_vnni), with panels_avx512.h's float steps per piece.
// Every token accumulates its pieces in one fixed order whatever tile or thread it
// runs in: results are batch-invariant.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/prefetch.h"
#include "kernels/x86/simd_avx2.h"

#include <algorithm>
#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {

// GCC's temporary expression replacement folds a chain of adds into one expression
// tree expanded at its end. The non-VNNI tile pins its chains (see tile); the VNNI
// tile's code is shaped by this too (without it, Q4_0 and Q5_K about 2 % slower on
// the Intel Xeon of tile's figures).
#pragma GCC push_options
#pragma GCC optimize("no-tree-ter")

namespace panel_avx2 {

constexpr int lut_extreme(const PanelLayout &l, bool largest) {
    int v = l.lut[0];
    for (int i = 1; i < 16; ++i) v = largest ? std::max(v, static_cast<int>(l.lut[i])) : std::min(v, static_cast<int>(l.lut[i]));
    return v;
}
// The operand the kernel multiplies is u = q + operand_offset: the stored bytes
// (non-table layouts), or a table layout's q shifted to start at 0.
constexpr int operand_offset(const PanelLayout &l) { return l.lut != nullptr ? -lut_extreme(l, false) : l.offset; }
constexpr int operand_max(const PanelLayout &l) {
    return l.lut != nullptr ? lut_extreme(l, true) - lut_extreme(l, false) : (1 << l.bits) - 1;
}
// Operands that one vpmaddubsw could saturate multiply as signed q (the sign trick);
// with VNNI none.
constexpr bool signed_operands(const PanelLayout &l) { return !kVnni256 && 2 * 127 * operand_max(l) > 32767; }
// Groups whose int16 sums add up before vpmaddwd (see the header); split layouts
// change scales at element 16, so their chunks stay within a half-piece.
constexpr int chunk_groups(const PanelLayout &l) {
    if (signed_operands(l)) return 1;
    int c = 8;
    while (c > 1 && 2 * c * operand_max(l) * 127 > 32767) c /= 2;
    return l.split ? std::min(c, 4) : c;
}

inline __m256i load256(const uint8_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
inline __m128i load128(const uint8_t *p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }

// Each byte of v shifted by s bits (left for s > 0) within 16-bit lanes: the masks
// keep only bits that stay inside their byte.
inline __m256i shift_bytes(__m256i v, int s) {
    if (s > 0) return _mm256_slli_epi16(v, s);
    if (s < 0) return _mm256_srli_epi16(v, -s);
    return v;
}

// The stored u of group g (elements 4g..4g+3) for rows 8h..8h+7, from the layout's
// planes (PanelLayout).
template <const PanelLayout &L> inline __m256i stored(const uint8_t *blk, int h, int g) {
    constexpr int low = panel_low_bits(L), high = L.bits - low;
    const uint8_t *at = blk + 32 * h;
    if constexpr (low == 8) return load256(at + 64 * g);
    __m256i w;
    if constexpr (low == 4) w = _mm256_and_si256(shift_bytes(load256(at + 64 * (g % 4)), -4 * (g / 4)), _mm256_set1_epi8(15));
    else w = _mm256_and_si256(shift_bytes(load256(at + 64 * (g / 4)), -2 * (g % 4)), _mm256_set1_epi8(3));
    const uint8_t *hp = at + 64 * low;
    if constexpr (high == 2)
        w = _mm256_or_si256(w, _mm256_and_si256(shift_bytes(load256(hp + 64 * (g / 4)), low - 2 * (g % 4)),
                                                _mm256_set1_epi8(static_cast<char>(3 << low))));
    else if constexpr (high == 1)
        w = _mm256_or_si256(w, _mm256_and_si256(shift_bytes(load256(hp), low - g), _mm256_set1_epi8(static_cast<char>(1 << low))));
    return w;
}

// A table layout's codes as operands (q, or q + operand_offset), 16 to a 128-bit lane.
template <const PanelLayout &L> inline __m256i code_table() {
    alignas(32) int8_t t[32] = {};
    if constexpr (L.lut != nullptr)
        for (int i = 0; i < 32; ++i) t[i] = static_cast<int8_t>(L.lut[i % 16] + (signed_operands(L) ? 0 : operand_offset(L)));
    return _mm256_load_si256(reinterpret_cast<const __m256i *>(t));
}

// The operand of group g for rows 8h..8h+7: u, or signed q for signed_operands.
template <const PanelLayout &L> inline __m256i operand(const uint8_t *blk, int h, int g, __m256i table) {
    const __m256i w = stored<L>(blk, h, g);
    if constexpr (L.lut != nullptr) return _mm256_shuffle_epi8(table, w);
    else if constexpr (signed_operands(L)) return _mm256_sub_epi8(w, _mm256_set1_epi8(static_cast<char>(L.offset)));
    else return w;
}

// A set of 16 int8 at p, rows 8h..8h+7, as int16 pairs (a_i, b_i) in row i's 32-bit
// lane: vpmaddwd's other operand.
inline __m256i int16_pairs(const uint8_t *a, const uint8_t *b, int h) {
    const __m128i va = load128(a), vb = load128(b);
    return _mm256_cvtepi8_epi16(h == 0 ? _mm_unpacklo_epi8(va, vb) : _mm_unpackhi_epi8(va, vb));
}

// The int16 pair (lo, hi), each within int16, in every 32-bit lane: vpmaddwd's other
// operand against int16_pairs.
inline __m256i broadcast_int16_pair(int32_t lo, int32_t hi) {
    return _mm256_set1_epi32((lo & 0xffff) | static_cast<int32_t>(static_cast<uint32_t>(hi) << 16));
}

// v as computed, in a register: GCC neither folds nor reassociates a chain of adds
// through it (see tile).
inline __m256i pinned(__m256i v) {
    asm("" : "+x"(v));
    return v;
}

inline __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(load128(p)); }

// A piece's float scales (or mins) for rows 8h..8h+7: f16 or f32.
template <const PanelLayout &L> inline __m256 piece_floats(const uint8_t *set, int h) {
    if constexpr (L.f16) return f16x8(set + 16 * h);
    else return _mm256_loadu_ps(reinterpret_cast<const float *>(set) + 8 * h);
}

// How far ahead a tile asks for the panel's bytes (see kPanelPrefetch in
// panels_avx512.h).
constexpr size_t kPrefetch = 6144;

// T tokens against one panel, rows 8h..8h+7 for h in [h0, h0 + H): the rows' dot
// products for each token into acc[t][h] (zeroed by the caller).
//
// Each token's sums are chains of adds, one add a product, pinned as written: GCC
// would otherwise reassociate a chain into a tree whose adds wait until the piece's
// products are all made, keeping them on the stack (in the piece loop of the 4-token
// tile, 52 stack accesses in Q4_0's and 46 in Q4_K's; pinned 12 and 13, the float and
// int32 sums the tile carries across pieces). One thread through a 2,048 × 4,096
// matrix for 256 tokens on an Intel Xeon (family 6 model 167), best of 3, two rounds:
// Q4_0 26.2 → 23.8 ms, Q8_0 41.8 → 36.2, Q4_K 28.3 → 26.3, Q6_K 39.1 → 37.1.
template <const PanelLayout &L, int T, int H>
void tile(const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, int h0, __m256 (*acc)[2]) {
    constexpr int C = chunk_groups(L);
    constexpr bool sgn = signed_operands(L);
    constexpr int off = sgn ? 0 : operand_offset(L);
    constexpr int64_t kGroup = L.k_scales ? QK_K / QK : 1;
    constexpr size_t kW = panel_weight_bytes(L), kSet = kPanel * (L.k_scales ? 1 : L.f16 ? 2 : 4);
    constexpr int kSets = L.split ? 2 : 1;
    const __m256i table = code_table<L>(), ones = _mm256_set1_epi16(1);
    // k_scales: a super-block's integer sums, scaled by the pieces' integer scales
    // (part) and min scales (msum), exact in int32 (at most 8 × 32 × 64 × 127 × 128).
    __m256i part[T][H], msum[T][H];
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) part[t][h] = msum[t][h] = _mm256_setzero_si256();
    for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
        for (int64_t i = 0; i < kGroup; ++i) {
            const int64_t b = b0 + i;
            const uint8_t *blk = panel + panel_piece_offset(L, b);
            prefetch_weights(blk + kPrefetch, panel_piece_bytes(L));
            const uint8_t *scales = blk + kW, *mins = scales + kSets * kSet;
            __m256i sum16[T][H], sum32[T][H];
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                __m256i w[H], u[H];
                for (int h = 0; h < H; ++h) {
                    w[h] = operand<L>(blk, h0 + h, g, table);
                    u[h] = sgn ? _mm256_sign_epi8(w[h], w[h]) : w[h];
                }
#pragma GCC unroll 16
                for (int t = 0; t < T; ++t) {
                    int32_t four;
                    std::memcpy(&four, x[t][b].qs + 4 * g, 4);
                    const __m256i xb = _mm256_set1_epi32(four);
                    for (int h = 0; h < H; ++h) {
                        const __m256i p = _mm256_maddubs_epi16(u[h], sgn ? _mm256_sign_epi8(xb, w[h]) : xb);
                        sum16[t][h] = g % C == 0 ? p : pinned(_mm256_add_epi16(sum16[t][h], p));
                        if ((g + 1) % C != 0) continue;
                        if constexpr (L.k_scales) {
                            const int set = L.split ? g / 4 : 0;
                            const uint8_t *s = scales + set * kSet;
                            part[t][h] = _mm256_add_epi32(part[t][h], _mm256_madd_epi16(sum16[t][h], int16_pairs(s, s, h0 + h)));
                        } else {
                            const __m256i v = _mm256_madd_epi16(sum16[t][h], ones);
                            sum32[t][h] = g + 1 == C ? v : pinned(_mm256_add_epi32(sum32[t][h], v));
                        }
                    }
                }
            }
            for (int t = 0; t < T; ++t) {
                const BlockQ8A &xb = x[t][b];
                if constexpr (L.k_scales && L.mins && !L.split) {
                    // One min a piece (Q4_K, Q5_K; no offset): each odd piece's vpmaddwd
                    // takes the mins of it and the piece before against their two sums,
                    // half the instructions of one piece at a time.
                    static_assert(off == 0, "an offset would need its own term");
                    if (i % 2 == 1) {
                        const uint8_t *before = panel + panel_piece_offset(L, b - 1) + kW + kSet;
                        const int32_t lo = x[t][b - 1].sum, hi = xb.sum;
                        const __m256i sums = broadcast_int16_pair(lo, hi);
                        for (int h = 0; h < H; ++h)
                            msum[t][h] = _mm256_add_epi32(msum[t][h], _mm256_madd_epi16(int16_pairs(before, mins, h0 + h), sums));
                    }
                } else if constexpr (L.k_scales) {
                    if constexpr (off != 0 || L.mins) {
                        // Per row: set_lo × sum_lo + set_hi × sum_hi (split layouts: Q2_K, Q3_K, Q6_K).
                        const int32_t lo = xb.sum_lo, hi = xb.sum - xb.sum_lo;
                        const __m256i sums = broadcast_int16_pair(lo, hi);
                        const uint8_t *s_hi = scales + (kSets - 1) * kSet, *m_hi = mins + (kSets - 1) * kSet;
                        for (int h = 0; h < H; ++h) {
                            if constexpr (off != 0) // the offset off every element: scale × off, within int16
                                part[t][h] = _mm256_add_epi32(part[t][h], _mm256_madd_epi16(_mm256_mullo_epi16(int16_pairs(scales, s_hi, h0 + h), _mm256_set1_epi16(-off)), sums));
                            if constexpr (L.mins)
                                msum[t][h] = _mm256_add_epi32(msum[t][h], _mm256_madd_epi16(int16_pairs(mins, m_hi, h0 + h), sums));
                        }
                    }
                } else {
                    const __m256 xd = _mm256_set1_ps(xb.d);
                    for (int h = 0; h < H; ++h) {
                        __m256i v = sum32[t][h];
                        if constexpr (off != 0) v = _mm256_add_epi32(v, _mm256_set1_epi32(-off * xb.sum));
                        acc[t][h0 + h] = _mm256_fmadd_ps(_mm256_mul_ps(piece_floats<L>(scales, h0 + h), xd), _mm256_cvtepi32_ps(v), acc[t][h0 + h]);
                        if constexpr (L.mins)
                            acc[t][h0 + h] = _mm256_fmadd_ps(piece_floats<L>(mins, h0 + h), _mm256_set1_ps(xb.s), acc[t][h0 + h]);
                    }
                }
            }
        }
        if constexpr (L.k_scales) { // the super-block meets the rows' d (and m) and the token's one x.d
            const uint8_t *header = panel_header(L, panel, b0);
            for (int t = 0; t < T; ++t) {
                const __m256 xd = _mm256_set1_ps(x[t][b0].d);
                for (int h = 0; h < H; ++h) {
                    acc[t][h0 + h] = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(header + 16 * (h0 + h)), xd), _mm256_cvtepi32_ps(part[t][h]), acc[t][h0 + h]);
                    part[t][h] = _mm256_setzero_si256();
                    if constexpr (L.mins) {
                        acc[t][h0 + h] = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(header + 2 * kPanel + 16 * (h0 + h)), xd), _mm256_cvtepi32_ps(msum[t][h]), acc[t][h0 + h]);
                        msum[t][h] = _mm256_setzero_si256();
                    }
                }
            }
        }
    }
}

// 8 rows' int8 scales (or mins) of a k_scales layout, as floats.
inline __m256 int8x8_floats(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}

// tile with VNNI: the same tile's results for rows 8h..8h+7 by panels_avx512.h's
// arithmetic, bit for bit (its integer sums are exact in any order; its float steps
// come in the same order per row). A split layout's two sets of 16 elements are
// summed and scaled one after the other.
template <const PanelLayout &L, int T, int H>
void tile_vnni(const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, int h0, __m256 (*acc)[2]) {
    constexpr int off = operand_offset(L);
    constexpr int64_t kGroup = L.k_scales ? QK_K / QK : 1;
    constexpr size_t kW = panel_weight_bytes(L), kSet = kPanel * (L.k_scales ? 1 : L.f16 ? 2 : 4);
    constexpr int kSets = L.split ? 2 : 1, kSetGroups = 8 / kSets;
    // Independent vpdpbusd chains per token and half: a tile of few tokens (a decode step,
    // a small verification) would otherwise wait on each vpdpbusd's latency (about 5
    // cycles at 2 a cycle) through one chain a half. Integer sums, so the same bits. One
    // token of a K-quant keeps 2: with 4 its part sums went to the stack (Intel Xeon, 2
    // threads, six rounds: 1B-shaped Q4_K_M 23.1 → 24.2 tok/s with 2, Qwen3.5-0.8B-shaped
    // 35.6 → 37.4).
    constexpr int kChains = std::min(kSetGroups, T >= 4 ? 1 : T >= 2 || L.k_scales ? 2 : 4);
    const __m256i table = code_table<L>();
    for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
        // k_scales: the rows' d and m of this 256, and each token's scaled piece sums.
        const uint8_t *header = L.k_scales ? panel_header(L, panel, b0) : nullptr;
        __m256 part[T][H];
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h) part[t][h] = _mm256_setzero_ps();
        for (int64_t i = 0; i < kGroup; ++i) {
            const int64_t b = b0 + i;
            const uint8_t *blk = panel + panel_piece_offset(L, b);
            prefetch_weights(blk + kPrefetch, panel_piece_bytes(L));
            // Unrolled, so that each group's g is a constant: rolled (GCC 12 keeps this
            // loop so), the split layouts computed every group's shifts and plane offsets
            // and kept the chains on the stack. One thread, 1,024 × 2,048 in cache, one
            // token (Intel Xeon, family 6 model 167): Q6_K 0.076 → 0.057 ms, Q3_K 0.056
            // → 0.050; 128 tokens through 2,048 × 4,096: Q6_K 11.4 → 9.7 ms, Q3_K 11.8 →
            // 9.8, Q2_K 11.6 → 11.1.
#pragma GCC unroll 2
            for (int set = 0; set < kSets; ++set) {
                __m256i sum[T][H], chain[T][H][kChains];
                for (int t = 0; t < T; ++t) {
                    const BlockQ8A &xb = x[t][b];
                    const int32_t set_sum = !L.split ? xb.sum : set == 0 ? xb.sum_lo : xb.sum - xb.sum_lo;
                    for (int h = 0; h < H; ++h) {
                        chain[t][h][0] = _mm256_set1_epi32(-off * set_sum);
                        for (int c = 1; c < kChains; ++c) chain[t][h][c] = _mm256_setzero_si256();
                    }
                }
#pragma GCC unroll 8
                for (int g = set * kSetGroups; g < (set + 1) * kSetGroups; ++g) {
                    __m256i w[H];
                    for (int h = 0; h < H; ++h) w[h] = operand<L>(blk, h0 + h, g, table);
#pragma GCC unroll 16
                    for (int t = 0; t < T; ++t) {
                        int32_t four;
                        std::memcpy(&four, x[t][b].qs + 4 * g, 4);
                        const __m256i xb = _mm256_set1_epi32(four);
                        for (int h = 0; h < H; ++h) chain[t][h][g % kChains] = dot4_u8s8(chain[t][h][g % kChains], w[h], xb);
                    }
                }
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < H; ++h) {
                        sum[t][h] = chain[t][h][0];
                        for (int c = 1; c < kChains; ++c) sum[t][h] = _mm256_add_epi32(sum[t][h], chain[t][h][c]);
                    }
                const uint8_t *scales = blk + kW + set * kSet, *mins = blk + kW + (kSets + set) * kSet;
                for (int h = 0; h < H; ++h) {
                    const int r = h0 + h;
                    const __m256 scale = L.k_scales ? int8x8_floats(scales + 8 * r) : piece_floats<L>(scales, r);
                    __m256 min = _mm256_setzero_ps();
                    if constexpr (L.mins)
                        min = L.k_scales ? _mm256_mul_ps(f16x8(header + 2 * kPanel + 16 * r), int8x8_floats(mins + 8 * r))
                                         : piece_floats<L>(mins, r);
                    for (int t = 0; t < T; ++t) {
                        const BlockQ8A &xb = x[t][b];
                        const __m256 sum_f = _mm256_cvtepi32_ps(sum[t][h]);
                        if constexpr (L.k_scales) part[t][h] = _mm256_fmadd_ps(scale, sum_f, part[t][h]);
                        else acc[t][r] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(xb.d)), sum_f, acc[t][r]);
                        if constexpr (L.mins) {
                            const float xs = !L.split ? xb.s : xb.d * static_cast<float>(set == 0 ? xb.sum_lo : xb.sum - xb.sum_lo);
                            acc[t][r] = _mm256_fmadd_ps(min, _mm256_set1_ps(xs), acc[t][r]);
                        }
                    }
                }
            }
        }
        if constexpr (L.k_scales) // the super-block meets the rows' d and the token's x.d
            for (int t = 0; t < T; ++t) {
                const __m256 xd = _mm256_set1_ps(x[t][b0 + kGroup - 1].d);
                for (int h = 0; h < H; ++h)
                    acc[t][h0 + h] = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(header + 16 * (h0 + h)), xd), part[t][h], acc[t][h0 + h]);
            }
    }
}

// Tokens sharing one unpacking of a group's weights, and how many of the panel's two
// halves they take at once: each token keeps an int16 sum per half in a register
// beside the group's two weight vectors, so 4 tokens over both halves (8 sums).
// Against the alternatives, one thread through a 2,048 × 8,192 matrix for 128 tokens
// (Zen 4, the fastest of 5 or 6 alternating processes): Q4_K 21.6 ms as is, 22.4 with
// 3 tokens over both halves, 27.6 / 29.5 with 6 / 8 tokens over one half at a time;
// Q6_K 27.2 as is, 29.0, 31.3 / 35.9, and 5 over one half 32.2.
// With VNNI (an int32 sum per token and half) the same shape, but 5 tokens for the split
// layouts with a high plane (Q3_K, Q6_K), whose unpacking and two float steps a piece want
// more tokens to share them. The same matrix with the avx-vnni sources built as EVEX
// (build_kernel_test.py's twin, held to 16 vector registers), the fastest of 5 or 6
// alternating processes: Q6_K 22.5 ms with 5 tokens, 26.8 with 4, 23.5 with 6; Q3_K 22.5
// and 27.5; Q2_K 23.9 and 23.1; with 5 tokens Q4_0 14.8 against 14.4, Q5_0 26.1 against
// 17.3, Q5_K 22.6 against 17.9, Q8_0 14.7 against 14.2, Q4_K 17.2 against 16.2. (The avx2
// kernel: Q4_K 23.2, Q6_K 27.0, Q3_K 25.1, Q4_0 20.2, Q8_0 39.1, and Q2_K 21.2, the one
// layout VNNI does not speed up.)
template <const PanelLayout &L> constexpr int tile_tokens() {
    return kVnni256 && L.split && L.bits != panel_low_bits(L) ? 5 : 4;
}
template <const PanelLayout &L> constexpr int tile_halves() { return 2; }

// T tokens against one panel: y[t][r] = dot (or += dot when add) for its valid rows.
template <const PanelLayout &L, int T>
void panel_tile(const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, float *const *y, int valid, bool add) {
    constexpr int H = tile_halves<L>();
    __m256 acc[T][2];
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int h0 = 0; h0 < 2; h0 += H) {
        if constexpr (kVnni256) tile_vnni<L, T, H>(panel, nb, x, h0, acc);
        else tile<L, T, H>(panel, nb, x, h0, acc);
    }
    // The valid rows through masked moves: a loop over them compiled to a call of memcpy
    // per tile and token, 2 % of a Qwen3.5-shaped prefill.
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lane),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8), lane)};
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < 2; ++h) {
            __m256 out = acc[t][h];
            if (add) out = _mm256_add_ps(out, _mm256_maskload_ps(y[t] + 8 * h, keep[h]));
            _mm256_maskstore_ps(y[t] + 8 * h, keep[h], out);
        }
}

// panel_tile for a run-time count of tokens, 1 to T: every count is an instantiation
// of its own, so that any batch unpacks each panel's weights once per tile (3 tokens,
// a decode step of three sessions or a speculative verification, in one tile, not 2 + 1).
template <const PanelLayout &L, int T = tile_tokens<L>()>
inline void panel_tile_upto(int tn, const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, float *const *y,
                            int valid, bool add) {
    if constexpr (T > 1)
        if (tn < T) return panel_tile_upto<L, T - 1>(tn, panel, nb, x, y, valid, add);
    panel_tile<L, T>(panel, nb, x, y, valid, add);
}

} // namespace panel_avx2

template <const PanelLayout &L>
void panel_matmul_avx2(const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1, const BlockQ8A *xq,
                       int n, float *y, int64_t y_stride, bool add) {
    constexpr int kTile = panel_avx2::tile_tokens<L>(); // fewer at the end
    const int64_t nb = cols / QK;
    const size_t pbytes = panel_bytes(L, nb);
    for (int64_t p = p0; p < p1; ++p) {
        const uint8_t *panel = packed + static_cast<size_t>(p) * pbytes;
        const int valid = static_cast<int>(std::min<int64_t>(kPanel, rows - p * kPanel));
        const BlockQ8A *x[kTile];
        float *out[kTile];
        for (int t0 = 0; t0 < n;) {
            const int tn = std::min(n - t0, kTile);
            for (int t = 0; t < tn; ++t) {
                x[t] = xq + static_cast<int64_t>(t0 + t) * nb;
                out[t] = y + static_cast<int64_t>(t0 + t) * y_stride + p * kPanel;
            }
            panel_avx2::panel_tile_upto<L>(tn, panel, nb, x, out, valid, add);
            t0 += tn;
        }
    }
}

#pragma GCC pop_options

// The kernel of each layout, for set_panels (kernels.h).
template <const PanelLayout &L> struct PanelsAvx2 {
    static constexpr PanelFn matmul = panel_matmul_avx2<L>;
};

} // namespace
} // namespace llmd
