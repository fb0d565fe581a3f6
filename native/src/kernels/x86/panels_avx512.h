// panels_avx512.h — the avx512 variant's kernel over repacked panels (quants.h), one
// instantiation per panel layout.
//
// For each 32-element piece the kernel unpacks 16 rows' weights once and reuses
// them for a tile of 6 to 10 tokens (panel_tile_tokens), or, for the plain 4-bit
// types, two panels' 32 rows for 4 or 5 tokens (panel_tile_pair). Weights are
// unsigned bytes u = q + offset; the offset is taken off exactly in integers
// (offset × the sum of x's int8 values, which BlockQ8A carries), so a piece's
// integer dot is exact and only the float scaling rounds.
// Each token accumulates its pieces in one fixed order whatever tile or thread it
// runs in: results are batch-invariant.
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/prefetch.h"

#include <algorithm>
#include <cstring>
#include <immintrin.h>

namespace llmd {
namespace {

// 16 rows' scales (or mins): set h of a piece's scale area, f16 or f32.
template <const PanelLayout &L> inline __m512 panel_floats(const uint8_t *p, int h) {
    if constexpr (L.f16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 32 * h)));
    else return _mm512_loadu_ps(p + 64 * h);
}

// The 4-bit codes' bytes u = lut[code] + offset, 16 to a 128-bit lane as vpshufb wants.
template <const PanelLayout &L> inline __m512i code_table() {
    alignas(64) uint8_t t[64] = {};
    if constexpr (L.lut != nullptr)
        for (int i = 0; i < 64; ++i) t[i] = static_cast<uint8_t>(L.lut[i % 16] + L.offset);
    return _mm512_load_si512(t);
}

// 16 rows' f16 values (a k_scales layout's d or m), as floats.
inline __m512 f16_floats(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}

// 16 rows' int8 scales of a k_scales layout, as floats.
inline __m512 int8_floats(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
}

// Each byte of v shifted by s bits (left for s > 0), within 16-bit lanes: a byte's
// bits that stay inside it are its own, which is all the masks below keep.
inline __m512i shift_bytes(__m512i v, int s) {
    if (s > 0) return _mm512_sll_epi16(v, _mm_cvtsi32_si128(s));
    if (s < 0) return _mm512_srl_epi16(v, _mm_cvtsi32_si128(-s));
    return v;
}

// A panel-block's weights as 8 vectors of bytes u (PanelLayout's planes).
template <const PanelLayout &L> inline void unpack_weights(const uint8_t *blk, __m512i w[8]) {
    constexpr int low = panel_low_bits(L), high = L.bits - low;
    if constexpr (low == 8) {
        for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(blk + 64 * g);
        return;
    } else if constexpr (low == 4) {
        const __m512i mask = _mm512_set1_epi8(0x0f);
        for (int j = 0; j < 4; ++j) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * j);
            w[j] = _mm512_and_si512(v, mask);
            w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        }
    } else {
        const __m512i mask = _mm512_set1_epi8(3);
        for (int m = 0; m < 2; ++m) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * m);
            for (int c = 0; c < 4; ++c) w[4 * m + c] = _mm512_and_si512(shift_bytes(v, -2 * c), mask);
        }
    }
    // The high plane's bits for w[g], moved above the low ones: w |= (h shifted) & mask
    // (ternary-logic table 0xF8 is a | (b & c)).
    const uint8_t *hp = blk + 64 * low;
    if constexpr (high == 2) {
        const __m512i mask = _mm512_set1_epi8(static_cast<char>(3 << low));
        for (int m = 0; m < 2; ++m) {
            const __m512i h = _mm512_loadu_si512(hp + 64 * m);
            for (int c = 0; c < 4; ++c)
                w[4 * m + c] = _mm512_ternarylogic_epi32(w[4 * m + c], shift_bytes(h, low - 2 * c), mask, 0xF8);
        }
    } else if constexpr (high == 1) {
        const __m512i mask = _mm512_set1_epi8(static_cast<char>(1 << low));
        const __m512i h = _mm512_loadu_si512(hp);
        for (int g = 0; g < 8; ++g) w[g] = _mm512_ternarylogic_epi32(w[g], shift_bytes(h, low - g), mask, 0xF8);
    }
}

// How far ahead of its reads a tile asks for the panel's bytes. With one token a
// panel-block's arithmetic is short, but still long enough that the core's reorder
// window holds only about 2 KB of loads in flight, and the hardware prefetcher alone
// keeps fewer bytes in flight than memory's latency × bandwidth: the loads stalled and
// one core streamed 27-35 GB/s. Asking 6 KB ahead (past the panel's end into the next
// panel, which follows it in memory; a prefetch past the matrix is harmless) let it
// stream 41-44 GB/s, as fast as a loop of plain loads; 2 KB ahead was not enough for
// the K-quants, 8 KB gained nothing more. Tiles of a few tokens (a speculative
// verification, a decode step of several sessions) read their panel once too: the
// 1B shape's Q4_K_M took 8-13 % less time for 3 to 8 tokens asking ahead (one
// thread); a prefill's tiles, whose panel is in cache after the first, lost nothing.
// (Measured with PREFETCHT0; which level the lines go to: prefetch.h.)
constexpr size_t kPanelPrefetch = 6144;

// The 16 rows' scales (and mins) of the piece at blk, set h for split layouts'
// elements 16..31: f16 or f32 floats, or a k_scales layout's integer scales, and its
// integer mins times the rows' m (f16 times a small integer, exact).
template <const PanelLayout &L> inline void piece_scales(const uint8_t *blk, __m512 m, __m512 scale[2], __m512 min[2]) {
    constexpr size_t kW = panel_weight_bytes(L), kSet = kPanel * (L.k_scales ? 1 : L.f16 ? 2 : 4);
    constexpr int kSets = L.split ? 2 : 1;
    for (int h = 0; h < kSets; ++h) {
        if constexpr (L.k_scales) {
            scale[h] = int8_floats(blk + kW + h * kSet);
            if constexpr (L.mins) min[h] = _mm512_mul_ps(m, int8_floats(blk + kW + (kSets + h) * kSet));
        } else {
            scale[h] = panel_floats<L>(blk + kW, h);
            if constexpr (L.mins) min[h] = panel_floats<L>(blk + kW + kSets * kSet, h);
        }
    }
}

// One token's float step for a piece of a layout without split scales: its integer dot
// `sum` times the rows' scale into part (k_scales) or, with the token's d, into acc;
// the rows' min times the token's s into acc.
template <const PanelLayout &L>
inline void whole_piece(__m512i sum, const __m512 scale[2], const __m512 min[2], const BlockQ8A &xb, __m512 &acc,
                        __m512 &part) {
    static_assert(!L.split);
    if constexpr (L.k_scales) part = _mm512_fmadd_ps(scale[0], _mm512_cvtepi32_ps(sum), part);
    else acc = _mm512_fmadd_ps(_mm512_mul_ps(scale[0], _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(sum), acc);
    if constexpr (L.mins) acc = _mm512_fmadd_ps(min[0], _mm512_set1_ps(xb.s), acc);
}

// A k_scales super-block's end for one token: its part sum meets the rows' d and the
// token's x.d (the one d its Q8K activations share per 256).
inline void end_super_block(__m512 d, float xd, __m512 &acc, __m512 &part) {
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd)), part, acc);
    part = _mm512_setzero_ps();
}

// T tokens against one panel: the 16 rows' dot products for each token.
template <const PanelLayout &L, int T>
void panel_tile(const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, float *const *y, int valid, bool add) {
    // k_scales layouts serve 256-element types, whose activations (Q8K) share one d
    // per 256: a super-block's scaled piece sums gather in part[t] and meet the rows'
    // d and the token's x.d once, after its 8 pieces (a loop of its own, so that no
    // test for a super-block's end sits among the tokens' work).
    constexpr int64_t kGroup = L.k_scales ? QK_K / QK : 1;
    __m512 acc[T], part[T];
    for (int t = 0; t < T; ++t) acc[t] = part[t] = _mm512_setzero_ps();
    const __m512i table = code_table<L>();
    for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
        __m512 d = _mm512_setzero_ps(), m = _mm512_setzero_ps(); // k_scales: the rows' d and m of this 256
        if constexpr (L.k_scales) {
            const uint8_t *header = panel_header(L, panel, b0);
            d = f16_floats(header);
            if constexpr (L.mins) m = f16_floats(header + 2 * kPanel);
        }
        for (int64_t i = 0; i < kGroup; ++i) {
            const int64_t b = b0 + i;
            const uint8_t *blk = panel + panel_piece_offset(L, b);
            prefetch_weights(blk + kPanelPrefetch, panel_piece_bytes(L));
            __m512i w[8]; // w[g]: rows × elements 4g..4g+3
            unpack_weights<L>(blk, w);
            if constexpr (L.lut != nullptr)
                for (int g = 0; g < 8; ++g) w[g] = _mm512_shuffle_epi8(table, w[g]);
            __m512 scale[2], min[2];
            piece_scales<L>(blk, m, scale, min);
            // Unrolled, so that each token's acc and part stay in registers whatever GCC's
            // heuristics decide: under -fwrapv (build_native.py) GCC 12 kept this loop
            // rolled for 8 and 10 tokens (and the accumulators in memory, 20 % slower).
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                const BlockQ8A &xb = x[t][b];
                const int32_t lo_sum = L.split ? xb.sum_lo : xb.sum;
                // Elements 0..15 and 16..31 in two chains: a dpbusd's latency exceeds its issue interval.
                __m512i lo = _mm512_set1_epi32(-L.offset * lo_sum), hi = _mm512_set1_epi32(-L.offset * (xb.sum - lo_sum));
                for (int g = 0; g < 4; ++g) {
                    int32_t a, c;
                    std::memcpy(&a, xb.qs + 4 * g, 4);
                    std::memcpy(&c, xb.qs + 16 + 4 * g, 4);
                    lo = _mm512_dpbusd_epi32(lo, w[g], _mm512_set1_epi32(a));
                    hi = _mm512_dpbusd_epi32(hi, w[g + 4], _mm512_set1_epi32(c));
                }
                if constexpr (!L.split) {
                    whole_piece<L>(_mm512_add_epi32(lo, hi), scale, min, xb, acc[t], part[t]);
                } else {
                    if constexpr (L.k_scales) {
                        part[t] = _mm512_fmadd_ps(scale[0], _mm512_cvtepi32_ps(lo), part[t]);
                        part[t] = _mm512_fmadd_ps(scale[1], _mm512_cvtepi32_ps(hi), part[t]);
                    } else {
                        const __m512 xd = _mm512_set1_ps(xb.d);
                        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(scale[0], xd), _mm512_cvtepi32_ps(lo), acc[t]);
                        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(scale[1], xd), _mm512_cvtepi32_ps(hi), acc[t]);
                    }
                    if constexpr (L.mins) {
                        acc[t] = _mm512_fmadd_ps(min[0], _mm512_set1_ps(xb.d * static_cast<float>(xb.sum_lo)), acc[t]);
                        acc[t] = _mm512_fmadd_ps(min[1], _mm512_set1_ps(xb.d * static_cast<float>(xb.sum - xb.sum_lo)), acc[t]);
                    }
                }
            }
        }
        if constexpr (L.k_scales)
            for (int t = 0; t < T; ++t) end_super_block(d, x[t][b0 + kGroup - 1].d, acc[t], part[t]);
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    for (int t = 0; t < T; ++t) {
        __m512 out = acc[t];
        if (add) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, y[t]));
        _mm512_mask_storeu_ps(y[t], mask, out);
    }
}

// Tokens sharing one unpacking of a panel's weights: as many as the 32 vector
// registers hold (each token keeps one or two accumulators beside the 8 weight
// vectors); past that the spills cost more than the unpacking saved. Measured per
// kind of layout on the 2-core Zen 5 (the tile of each width against the others,
// one thread, 256 tokens): 8 where a token keeps acc and part (or its mins), 10 for
// the K-quants without mins (Q3_K, Q6_K, IQ4_XS: +8 % over 8), and 6 for 8-bit
// weights, which have nothing to unpack and lost 9 % at 8.
constexpr int panel_tile_tokens(const PanelLayout &l) {
    if (l.bits == 8) return 6;
    return l.k_scales && !l.mins ? 10 : 8;
}

// Layouts whose pieces two panels can share a tile: plain 4-bit codes, one scale (and
// min) per 32-element piece (Q4_0, Q4_1, Q4_K). A tile of 16 rows broadcasts each 4
// bytes of a token's activations for one vpdpbusd; over two panels' 32 rows each
// broadcast serves two, and a piece's float steps are the same arithmetic as
// panel_tile's.
constexpr bool panel_pairs(const PanelLayout &l) { return l.bits == 4 && !l.split && l.lut == nullptr; }

// How far ahead a two-panel tile asks for each panel's bytes: the 1B shape's Q4_0
// took 13-18 % less time for 5 to 8 tokens asking 2 KB ahead (one thread).
constexpr size_t kPairPrefetch = 2048;

// Tokens of a two-panel tile: each keeps two integer sums and two accumulators (four
// with a K-quant's part sums) beside the 4 weight vectors of a plane and their 2
// broadcasts. Measured on prefill of 512 tokens against single panels, builds taking
// turns: the 1B shape's Q4_0 16 % less time a token (6 tokens: 5 % slower than 5; 4:
// 2 % slower), its Q4_K_M 6-9 % (4 tokens; 3: 7 %, 5: 7 %, 6: 6 %, 2: none), SmolLM2's
// Q4_1 6 % (5 tokens; 4: 4 %).
constexpr int pair_tile_tokens(const PanelLayout &l) { return l.k_scales ? 4 : 5; }

// T tokens against panels a and b (32 rows): panel_tile's results for each, bit for bit
// (a piece's integer dot is exact however its multiply-adds are chained).
template <const PanelLayout &L, int T>
void panel_tile_pair(const uint8_t *pa, const uint8_t *pb, int64_t nb, const BlockQ8A *const *x, float *const *ya,
                     float *const *yb, bool add) {
    static_assert(panel_pairs(L));
    constexpr int64_t kGroup = L.k_scales ? QK_K / QK : 1;
    __m512 acc_a[T], acc_b[T], part_a[T], part_b[T];
    for (int t = 0; t < T; ++t) acc_a[t] = acc_b[t] = part_a[t] = part_b[t] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(0x0f);
    for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
        __m512 d_a = _mm512_setzero_ps(), d_b = d_a, m_a = d_a, m_b = d_a; // k_scales: the rows' d and m of this 256
        if constexpr (L.k_scales) {
            const uint8_t *ha = panel_header(L, pa, b0), *hb = panel_header(L, pb, b0);
            d_a = f16_floats(ha);
            d_b = f16_floats(hb);
            if constexpr (L.mins) {
                m_a = f16_floats(ha + 2 * kPanel);
                m_b = f16_floats(hb + 2 * kPanel);
            }
        }
        for (int64_t i = 0; i < kGroup; ++i) {
            const int64_t b = b0 + i;
            const uint8_t *ba = pa + panel_piece_offset(L, b), *bb = pb + panel_piece_offset(L, b);
            prefetch_weights(ba + kPairPrefetch, panel_piece_bytes(L)); // two streams: see kPairPrefetch
            prefetch_weights(bb + kPairPrefetch, panel_piece_bytes(L));
            __m512i sa[T], sb[T];
            for (int t = 0; t < T; ++t) sa[t] = sb[t] = _mm512_set1_epi32(-L.offset * x[t][b].sum);
            for (int j = 0; j < 4; ++j) { // plane j: elements 4j..4j+3 (low nibbles) and 16+4j.. (high)
                const __m512i va = _mm512_loadu_si512(ba + 64 * j), vb = _mm512_loadu_si512(bb + 64 * j);
                const __m512i a_lo = _mm512_and_si512(va, mask), a_hi = _mm512_and_si512(_mm512_srli_epi16(va, 4), mask);
                const __m512i b_lo = _mm512_and_si512(vb, mask), b_hi = _mm512_and_si512(_mm512_srli_epi16(vb, 4), mask);
#pragma GCC unroll 16
                for (int t = 0; t < T; ++t) {
                    int32_t lo, hi;
                    std::memcpy(&lo, x[t][b].qs + 4 * j, 4);
                    std::memcpy(&hi, x[t][b].qs + 16 + 4 * j, 4);
                    const __m512i xl = _mm512_set1_epi32(lo), xh = _mm512_set1_epi32(hi);
                    sa[t] = _mm512_dpbusd_epi32(sa[t], a_lo, xl);
                    sb[t] = _mm512_dpbusd_epi32(sb[t], b_lo, xl);
                    sa[t] = _mm512_dpbusd_epi32(sa[t], a_hi, xh);
                    sb[t] = _mm512_dpbusd_epi32(sb[t], b_hi, xh);
                }
            }
            __m512 scale_a[2], min_a[2], scale_b[2], min_b[2];
            piece_scales<L>(ba, m_a, scale_a, min_a);
            piece_scales<L>(bb, m_b, scale_b, min_b);
            for (int t = 0; t < T; ++t) {
                whole_piece<L>(sa[t], scale_a, min_a, x[t][b], acc_a[t], part_a[t]);
                whole_piece<L>(sb[t], scale_b, min_b, x[t][b], acc_b[t], part_b[t]);
            }
        }
        if constexpr (L.k_scales)
            for (int t = 0; t < T; ++t) {
                end_super_block(d_a, x[t][b0 + kGroup - 1].d, acc_a[t], part_a[t]);
                end_super_block(d_b, x[t][b0 + kGroup - 1].d, acc_b[t], part_b[t]);
            }
    }
    for (int t = 0; t < T; ++t) {
        __m512 a = acc_a[t], c = acc_b[t];
        if (add) {
            a = _mm512_add_ps(a, _mm512_loadu_ps(ya[t]));
            c = _mm512_add_ps(c, _mm512_loadu_ps(yb[t]));
        }
        _mm512_storeu_ps(ya[t], a);
        _mm512_storeu_ps(yb[t], c);
    }
}

// panel_tile for a run-time count of tokens, 1 to T: every count is an instantiation
// of its own, so that any batch unpacks each panel's weights once per tile. Before,
// the rest of a batch past its full tiles went in tiles of 4, 2 and 1, and 3 tokens
// (a decode step of three sessions, a speculative verification) cost more than 4.
template <const PanelLayout &L, int T = panel_tile_tokens(L)>
inline void panel_tile_upto(int tn, const uint8_t *panel, int64_t nb, const BlockQ8A *const *x, float *const *y,
                            int valid, bool add) {
    if constexpr (T > 1)
        if (tn < T) return panel_tile_upto<L, T - 1>(tn, panel, nb, x, y, valid, add);
    panel_tile<L, T>(panel, nb, x, y, valid, add);
}

template <const PanelLayout &L>
void panel_matmul(const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1, const BlockQ8A *xq,
                  int n, float *y, int64_t y_stride, bool add) {
    constexpr int kTile = panel_tile_tokens(L); // fewer at the end
    const int64_t nb = cols / QK;
    const size_t pbytes = panel_bytes(L, nb);
    const auto x_of = [&](int t) { return xq + static_cast<int64_t>(t) * nb; };
    const auto y_of = [&](int t, int64_t p) { return y + static_cast<int64_t>(t) * y_stride + p * kPanel; };
    // Tokens [t0, n) against panel p, in tiles of kTile.
    const auto tiles = [&](int64_t p, int t0) {
        const uint8_t *panel = packed + static_cast<size_t>(p) * pbytes;
        const int valid = static_cast<int>(std::min<int64_t>(kPanel, rows - p * kPanel));
        const BlockQ8A *x[kTile];
        float *out[kTile];
        while (t0 < n) {
            const int tn = std::min(n - t0, kTile);
            for (int t = 0; t < tn; ++t) {
                x[t] = x_of(t0 + t);
                out[t] = y_of(t0 + t, p);
            }
            panel_tile_upto<L>(tn, panel, nb, x, out, valid, add);
            t0 += tn;
        }
    };
    for (int64_t p = p0; p < p1; ++p) {
        if constexpr (panel_pairs(L)) {
            constexpr int kPair = pair_tile_tokens(L);
            // Panels p and p + 1, full, when each piece serves two tiles or more: with one
            // tile (a speculative verification, a decode step of several sessions) a
            // pass streams its weights once, and one stream read ahead of the single
            // tiles beat the pair's two (5 tokens: SmolLM2 23 % less time, the 1B shape's
            // Q4_K_M 10 %, its Q4_0 alike; one thread).
            if (p + 1 < p1 && (p + 2) * kPanel <= rows && n >= 2 * kPair) {
                const uint8_t *pa = packed + static_cast<size_t>(p) * pbytes, *pb = pa + pbytes;
                int t0 = 0;
                for (; t0 + kPair <= n; t0 += kPair) {
                    const BlockQ8A *x[kPair];
                    float *ya[kPair], *yb[kPair];
                    for (int t = 0; t < kPair; ++t) {
                        x[t] = x_of(t0 + t);
                        ya[t] = y_of(t0 + t, p);
                        yb[t] = y_of(t0 + t, p + 1);
                    }
                    panel_tile_pair<L, kPair>(pa, pb, nb, x, ya, yb, add);
                }
                tiles(p, t0);
                tiles(p + 1, t0);
                ++p;
                continue;
            }
        }
        tiles(p, 0);
    }
}

// The kernel of each layout, for set_panels (kernels.h).
template <const PanelLayout &L> struct PanelsAvx512 {
    static constexpr PanelFn matmul = panel_matmul<L>;
};

} // namespace
} // namespace llmd
