// quantize.cpp — see quantize.h. The block layouts are the ones quants.cpp decodes;
// each quantizer below writes exactly what that decoder reads back.
#include "quants/quantize.h"

#include "runtime/threadpool.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

// The algorithms round every product and sum to float as written: fused multiply-adds
// (which -march=native lets the compiler form) would move some values across a
// rounding boundary, and the files would no longer be byte for byte llama.cpp's.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace llmd {

namespace {

// Below this magnitude a group counts as all zeros.
constexpr float kGroupEps = 1e-15f;

// Nearest integer, halves to even (the rounding of the published K-quant code).
int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

void store_half(uint8_t *p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}
float stored_half(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return fp16_to_fp32(h);
}

// The signed value of largest magnitude (the first one on ties).
float signed_max(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

void min_max(const float *x, int n, float *lo, float *hi) {
    *lo = FLT_MAX;
    *hi = -FLT_MAX;
    for (int j = 0; j < n; ++j) {
        *lo = std::min(*lo, x[j]);
        *hi = std::max(*hi, x[j]);
    }
}

// 32 codes of `bits` (4 or 5) into the nibbles (element j low, 16 + j high) and,
// for 5 bits, the word of fifth bits (bit j for element j).
void pack_codes(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t high = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
        high |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
        high |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qh != nullptr) std::memcpy(qh, &high, 4);
}

// Symmetric 32-blocks (Q4_0: 16 levels, Q5_0: 32): d = max / -half, the codes
// truncated from x / d + half + 0.5 and capped at 2 half - 1.
void quantize_symmetric(const float *x, uint8_t *b, int half, uint8_t *qh, uint8_t *qs) {
    const float d = signed_max(x, QK) / static_cast<float>(-half);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(b, d);
    int q[QK];
    for (int j = 0; j < QK; ++j)
        q[j] = std::min(2 * half - 1, static_cast<int>(x[j] * id + (static_cast<float>(half) + 0.5f)));
    pack_codes(q, qs, qh);
}

// Asymmetric 32-blocks (Q4_1: 15 steps, Q5_1: 31): d = (max - min) / steps, m = min.
void quantize_affine(const float *x, uint8_t *b, int steps, uint8_t *qh, uint8_t *qs) {
    float lo, hi;
    min_max(x, QK, &lo, &hi);
    const float d = (hi - lo) / static_cast<float>(steps);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(b, d);
    store_half(b + 2, lo);
    int q[QK];
    for (int j = 0; j < QK; ++j) q[j] = std::min(steps, static_cast<int>((x[j] - lo) * id + 0.5f));
    pack_codes(q, qs, qh);
}

// Q6_K's per-16 search: codes l in [-nmax, nmax - 1] for a scale chosen among
// -(nmax + 0.1 k) / max, k = -9..9, by the least x²-weighted squared error (the
// closed-form best scale for each candidate's codes). L gets l + nmax; returns the scale.
float search_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < kGroupEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.0f;
    }
    auto code = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest(iscale * x[i]))); };
    float iscale = -static_cast<float>(nmax) / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = code(iscale, i);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = code(iscale, i);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * static_cast<float>(l);
            suml2 += w * static_cast<float>(l) * static_cast<float>(l);
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(code(iscale, i) + nmax);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q4_K/Q5_K's per-32 search: codes l in [0, nmax] with x ≈ scale * l - min_out, for a
// scale chosen among (nmax + rmin + rdelta k) / (max - min), k = 0..nstep, each
// refitted by weighted least squares (min kept <= 0), by the least weighted squared
// error. Returns the scale; *min_out is the (non-negative) min subtracted.
float search_affine(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *min_out, float rmin,
                    float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        min = std::min(min, x[i]);
        max = std::max(max, x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        std::fill(L, L + n, uint8_t{0});
        *min_out = -min;
        return 0.0f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest(iscale * (x[i] - min)))));
        const float diff = scale * static_cast<float>(L[i]) + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    uint8_t trial[QK];
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::max(0, std::min(nmax, nearest(iscale * (x[i] - min))));
            trial[i] = static_cast<uint8_t>(l);
            const float w = weights[i], fl = static_cast<float>(l);
            sum_l += w * fl;
            sum_l2 += w * fl * fl;
            sum_xl += w * fl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float error = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float diff = this_scale * static_cast<float>(trial[i]) + this_min - x[i];
            error += weights[i] * (diff * diff);
        }
        if (error < best_error) {
            std::copy(trial, trial + n, L);
            best_error = error;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

// One Q4_K or Q5_K super-block's scales: 8 searched (scale, min) pairs as 6-bit
// integers of d = max scale / 63 and dmin = max min / 63, packed as scale_min_k4 in
// quants.cpp reads them; then every code recomputed against the stored scales. L
// holds the 256 codes in [0, nmax].
void quantize_k_super(const float *x, int nmax, float rmin, int nstep, uint8_t *d_at, uint8_t *scales, uint8_t *L) {
    float sc[8], mn[8], weights[QK];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
        const float *xj = x + QK * j;
        float sum_x2 = 0.0f;
        for (int l = 0; l < QK; ++l) sum_x2 += xj[l] * xj[l];
        const float av_x = std::sqrt(sum_x2 / QK);
        for (int l = 0; l < QK; ++l) weights[l] = av_x + std::fabs(xj[l]);
        sc[j] = search_affine(QK, nmax, xj, weights, L + QK * j, &mn[j], rmin, 0.1f, nstep);
        max_scale = std::max(max_scale, sc[j]);
        max_min = std::max(max_min, mn[j]);
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    std::memset(scales, 0, 12);
    for (int j = 0; j < 8; ++j) {
        // As bytes, then capped: a negative fit wraps and caps at 63, as the format's own tools do.
        const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest(inv_scale * sc[j])));
        const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest(inv_min * mn[j])));
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
            scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
            scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
        }
    }
    store_half(d_at, max_scale / 63.0f);
    store_half(d_at + 2, max_min / 63.0f);
    const float d_all = stored_half(d_at), dmin_all = stored_half(d_at + 2);
    for (int j = 0; j < 8; ++j) {
        const int s = j < 4 ? scales[j] & 63 : (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4;
        const int m = j < 4 ? scales[j + 4] & 63 : (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
        const float d = d_all * static_cast<float>(s);
        if (d == 0.0f) continue;
        const float dm = dmin_all * static_cast<float>(m);
        for (int i = 0; i < QK; ++i)
            L[QK * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest((x[QK * j + i] + dm) / d))));
    }
}

} // namespace

void quantize_row_q8_0(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(out, d);
        for (int j = 0; j < QK; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
    }
}

void quantize_row_q4_0(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 18) quantize_symmetric(x, out, 8, nullptr, out + 2);
}
void quantize_row_q5_0(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 22) quantize_symmetric(x, out, 16, out + 2, out + 6);
}
void quantize_row_q4_1(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 20) quantize_affine(x, out, 15, nullptr, out + 4);
}
void quantize_row_q5_1(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 24) quantize_affine(x, out, 31, out + 4, out + 8);
}

bool q4_0_kv_candidates(float m, float *iscale) {
    static constexpr float kDivisors[kQ4KVCandidates] = {6.6f, 7.0f, 7.4f, 7.8f, 8.2f, 8.6f, 9.0f, 9.4f};
    if (!(std::fabs(m) >= kGroupEps)) return false;
    for (int c = 0; c < kQ4KVCandidates; ++c) iscale[c] = -kDivisors[c] / m;
    return true;
}

int q4_0_kv_pick(const float *sxl, const float *sll) {
    int best = 0;
    float fit = sxl[0] / sll[0] * sxl[0]; // (Σxl)² / Σl²: the squared norm the candidate's fit explains
    for (int c = 1; c < kQ4KVCandidates; ++c)
        if (sxl[c] * sxl[c] > fit * sll[c]) {
            best = c;
            fit = sxl[c] / sll[c] * sxl[c];
        }
    return best;
}

void quantize_row_q4_0_kv(const float *x, uint8_t *out, int64_t n) {
    for (int64_t k = 0; k < n / QK; ++k, x += QK, out += 18) {
        float iscale[kQ4KVCandidates], sxl[kQ4KVCandidates] = {}, sll[kQ4KVCandidates] = {};
        if (!q4_0_kv_candidates(signed_max(x, QK), iscale)) {
            store_half(out, 0.0f);
            std::memset(out + 2, 0x88, 16);
            continue;
        }
        auto code = [&](int c, int j) { return std::max(-8.0f, std::min(7.0f, std::nearbyint(iscale[c] * x[j]))); };
        for (int c = 0; c < kQ4KVCandidates; ++c)
            for (int j = 0; j < QK; ++j) {
                const float l = code(c, j);
                sxl[c] = std::fma(x[j], l, sxl[c]);
                sll[c] = std::fma(l, l, sll[c]);
            }
        const int c = q4_0_kv_pick(sxl, sll);
        store_half(out, sxl[c] / sll[c]);
        int q[QK];
        for (int j = 0; j < QK; ++j) q[j] = static_cast<int>(code(c, j)) + 8;
        pack_codes(q, out + 2, nullptr);
    }
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of scales, then per 64 elements 32
// bytes: element l in the low nibble of byte l, element 32 + l in its high nibble.
void quantize_row_q4_k(const float *x, uint8_t *out, int64_t n) {
    uint8_t L[QK_K];
    for (int64_t k = 0; k < n / QK_K; ++k, x += QK_K, out += 144) {
        quantize_k_super(x, 15, -1.0f, 20, out, out + 4, L);
        uint8_t *qs = out + 16;
        for (int j = 0; j < QK_K; j += 64, qs += 32)
            for (int l = 0; l < 32; ++l) qs[l] = static_cast<uint8_t>(L[j + l] | L[j + l + 32] << 4);
    }
}

// Q5_K (176): as Q4_K with 32 bytes of fifth bits after the scales: bit j of byte l
// is the fifth bit of element l of sub-block j.
void quantize_row_q5_k(const float *x, uint8_t *out, int64_t n) {
    uint8_t L[QK_K];
    for (int64_t k = 0; k < n / QK_K; ++k, x += QK_K, out += 176) {
        quantize_k_super(x, 31, -0.5f, 15, out, out + 4, L);
        uint8_t *qh = out + 16, *qs = out + 48;
        std::memset(qh, 0, 32);
        for (int j = 0; j < 8; j += 2, qs += 32)
            for (int l = 0; l < 32; ++l) {
                const int lo = L[QK * j + l], hi = L[QK * (j + 1) + l];
                qs[l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
                qh[l] |= static_cast<uint8_t>((lo >> 4) << j | (hi >> 4) << (j + 1));
            }
    }
}

// Q6_K (210): 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16 d
// (the layout decode_q6_k reads).
void quantize_row_q6_k(const float *x, uint8_t *out, int64_t n) {
    int8_t L[QK_K];
    float scales[16];
    for (int64_t k = 0; k < n / QK_K; ++k, x += QK_K, out += 210) {
        float max_scale = 0.0f, max_abs_scale = 0.0f;
        for (int ib = 0; ib < 16; ++ib) {
            scales[ib] = search_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
            if (std::fabs(scales[ib]) > max_abs_scale) {
                max_abs_scale = std::fabs(scales[ib]);
                max_scale = scales[ib];
            }
        }
        std::memset(out, 0, 210);
        if (max_abs_scale < kGroupEps) continue; // all zeros: d = 0
        const float iscale = -128.0f / max_scale;
        store_half(out + 208, 1.0f / iscale);
        auto *sc = reinterpret_cast<int8_t *>(out + 192);
        for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest(iscale * scales[ib])));
        const float d_all = stored_half(out + 208);
        for (int ib = 0; ib < 16; ++ib) {
            const float d = d_all * static_cast<float>(sc[ib]);
            if (d == 0.0f) continue;
            for (int i = 0; i < 16; ++i)
                L[16 * ib + i] = static_cast<int8_t>(std::max(-32, std::min(31, nearest(x[16 * ib + i] / d))) + 32);
        }
        uint8_t *ql = out, *qh = out + 128;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; ++l) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = static_cast<uint8_t>((q1 & 15) | (q3 & 15) << 4);
                ql[l + 32] = static_cast<uint8_t>((q2 & 15) | (q4 & 15) << 4);
                qh[l] = static_cast<uint8_t>(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
    }
}

void quantize_row_f32(const float *x, uint8_t *out, int64_t n) { std::memcpy(out, x, static_cast<size_t>(n) * 4); }
void quantize_row_f16(const float *x, uint8_t *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) store_half(out + 2 * i, x[i]);
}
// BF16: the top half of the f32, rounded to nearest even (NaN stays a quiet NaN).
void quantize_row_bf16(const float *x, uint8_t *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &x[i], 4);
        const uint16_t h = (u & 0x7fffffff) > 0x7f800000 ? static_cast<uint16_t>((u >> 16) | 64)
                                                         : static_cast<uint16_t>((u + (0x7fff + ((u >> 16) & 1))) >> 16);
        std::memcpy(out + 2 * i, &h, 2);
    }
}

std::string convert_rows(uint32_t src_type, const uint8_t *src, int64_t rows, int64_t cols, uint32_t dst_type,
                         uint8_t *dst, ThreadPool &pool) {
    const TypeTraits *from = type_traits(src_type), *to = type_traits(dst_type);
    if (rows < 0 || cols <= 0 || cols % from->block_elems != 0 || cols % to->block_elems != 0)
        return "a row of " + std::to_string(cols) + " elements is not a whole number of " + from->name + " and " +
               to->name + " blocks";
    const size_t in_bytes = row_bytes(src_type, cols), out_bytes = row_bytes(dst_type, cols);
    // Tasks take whole rows, so a row's bytes never depend on the split.
    const int tasks = static_cast<int>(std::min<int64_t>(rows, 4 * static_cast<int64_t>(pool.size())));
    std::atomic<int64_t> bad_row{-1};
    pool.run(tasks, [&](int task) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = rows * task / tasks; r < rows * (task + 1) / tasks; ++r) {
            from->to_float(src + static_cast<size_t>(r) * in_bytes, row.data(), cols);
            if (!std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); })) {
                // Report the first bad row whichever thread finds it.
                int64_t seen = bad_row.load();
                while ((seen < 0 || r < seen) && !bad_row.compare_exchange_weak(seen, r)) {}
                return;
            }
            to->from_float(row.data(), dst + static_cast<size_t>(r) * out_bytes, cols);
        }
    });
    if (bad_row.load() >= 0) return "row " + std::to_string(bad_row.load()) + " holds a value that is not finite";
    return {};
}

} // namespace llmd
