// fold.h — attend_fold's loop (ops/attention.h) for whichever translation unit includes
// it: the reference (ops/attention.cpp, built for the ISA's baseline) and the variants
// whose flags let the compiler turn it into vector fused multiply-adds. Without FMA in
// the baseline (x86-64), std::fma is a call into libm for every element, which made
// folding a long context's partials a tenth of a 2k-token prefill. The x86 variants
// take this loop; arm64's baseline has FMA, so its variants keep the reference.
//
// A fused multiply-add rounds once, so every build of this loop folds the same bits.
// Anonymous namespace: each including unit keeps its own copy, built with its own
// flags (kernels.h).
#pragma once

#include "ops/attention.h"

#include <algorithm>
#include <cmath>

namespace llmd {
namespace {

// Explicit fused multiply-adds: the compiler may not contract these differently
// wherever it inlines them, so every caller folds the same bits.
inline void fold_partial(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd) {
    for (int g = 0; g < n_q; ++g) {
        const float m0 = acc[g].max, m1 = part[g].max, mx = std::max(m0, m1);
        // The side with the larger max keeps its scale exp(0) = 1; the other shrinks
        // (to 0 on the first fold, where m0 is -inf).
        const float e = std::exp(std::min(m0, m1) - mx), a = m0 < m1 ? e : 1.0f, b = m0 < m1 ? 1.0f : e;
        float *yg = y + static_cast<size_t>(g) * hd;
        const float *og = out + static_cast<size_t>(g) * hd;
        for (int d = 0; d < hd; ++d) yg[d] = std::fma(yg[d], a, og[d] * b);
        acc[g] = {mx, std::fma(acc[g].sum, a, part[g].sum * b)};
    }
}

} // namespace
} // namespace llmd
